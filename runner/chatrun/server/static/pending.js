/* Pending items (humans in the loop, docs/operators.md) as cards, for the chat page and the
 * operator page alike: an approval with its arguments, Approve/Reject and the editable ones;
 * a question as buttons (its choices) or a form built from its JSON Schema; a takeover.
 * Plain JavaScript, no build step; builds nodes, never HTML. */
(function () {
  "use strict";

  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = text;
    return node;
  }

  function humanize(key) {
    const words = String(key).replace(/([a-z])([A-Z])/g, "$1 $2").replace(/[_-]+/g, " ").trim().toLowerCase();
    return words.charAt(0).toUpperCase() + words.slice(1);
  }

  function plain(value) {
    if (value === null || value === undefined) return "—";
    if (value === true) return TEXTS.yes.toLowerCase();
    if (value === false) return TEXTS.no.toLowerCase();
    return typeof value === "object" ? JSON.stringify(value) : String(value);
  }

  const KIND_TITLE = { approval: "kind_approval", question: "kind_question", takeover: "kind_takeover" };

  // The texts end users read on a card; the chat page sets them in the session's locale
  // (setTexts, with the keys of definition/page_texts.py), the operator page keeps English.
  const TEXTS = {
    kind_approval: "Approval", kind_question: "Question", kind_takeover: "Operator",
    approve: "Approve", reject: "Reject", answer: "Send",
    waiting_approval: "Waiting for approval…", waiting_answer: "Waiting for an answer…",
    waiting_operator: "Waiting for an operator…",
    approved: "Approved", edited: "Approved with changes", rejected: "Rejected", timed_out: "Timed out",
    answered: "Answered", released: "Released", taken: "Taken over", by: "by {name}",
    held_note: "applies when the conversation is released",
    yes: "Yes", no: "No",
    change_arg: "Change {name}", reason_optional: "Reason (optional; the bot is told)",
    operator_unnamed: "an operator",
  };
  const WAITING = { approval: "waiting_approval", question: "waiting_answer", takeover: "waiting_operator" };

  /** The user's own confirmation (`confirm:`): an approval that carries its own choices (Yes
   * and No, in the session's locale) instead of Approve and Reject; null for any other item. */
  function confirmation(item) {
    const choices = item.kind === "approval" ? item.choices || [] : [];
    if (choices.length !== 2 || choices.some((c) => c.value === "approve" || c.value === "reject")) return null;
    return { yes: choices[0].label, no: choices[1].label };
  }

  function setTexts(texts) {
    for (const key of Object.keys(TEXTS)) if (typeof texts[key] === "string") TEXTS[key] = texts[key];
  }

  // -- one form field per JSON Schema property (string, number, integer, boolean, enum) -------

  /** A labelled input for `schema`; .read() gives the value or throws the problem as text. */
  function field(name, schema, required, initial, label) {
    const box = el("label", "pf-field");
    box.dataset.field = name;
    const title = (schema && schema.title) || humanize(name);
    box.appendChild(el("span", "pf-label", label || title + (required ? " *" : "")));
    let input;
    const type = schema && (schema.enum ? "enum" : schema.type);
    if (type === "enum") {
      input = el("select");
      if (!required || initial === undefined) input.appendChild(el("option", "", "")).value = "";
      for (const option of schema.enum) {
        const o = el("option", "", plain(option));
        o.value = JSON.stringify(option);
        input.appendChild(o);
      }
      if (initial !== undefined) input.value = JSON.stringify(initial);
    } else if (type === "boolean") {
      input = el("input");
      input.type = "checkbox";
      input.checked = Boolean(initial);
      box.classList.add("pf-check");
    } else {
      input = el("input");
      input.type = type === "number" || type === "integer" ? "number" : "text";
      if (type === "number") input.step = "any";
      if (initial !== undefined && initial !== null) input.value = String(initial);
    }
    input.name = name;
    box.appendChild(input);
    const problem = el("span", "pf-problem");
    problem.setAttribute("role", "alert");
    box.appendChild(problem);
    box.read = () => {
      problem.textContent = "";
      let value;
      if (type === "enum") value = input.value === "" ? undefined : JSON.parse(input.value);
      else if (type === "boolean") value = input.checked;
      else if (input.validity && input.validity.badInput) return fail(title + " must be a number");
      else if (input.value.trim() === "") value = undefined;
      else if (type === "number" || type === "integer") {
        value = Number(input.value);
        if (!Number.isFinite(value)) return fail(title + " must be a number");
        if (type === "integer" && !Number.isInteger(value)) return fail(title + " must be a whole number");
      } else value = input.value;
      if (value === undefined && required) return fail(title + " is required");
      return value;
    };
    function fail(text) {
      problem.textContent = text;
      throw new Error(text);
    }
    input.addEventListener(type === "enum" || type === "boolean" ? "change" : "input", () => { problem.textContent = ""; });
    box.input = input;
    return box;
  }

  /** Fields for a schema: an object's properties, or one field for a plain value. */
  function schemaForm(schema) {
    const form = el("div", "pf-form");
    const fields = [];
    if (schema && schema.type === "object" && schema.properties) {
      const required = new Set(schema.required || []);
      for (const name of Object.keys(schema.properties)) {
        fields.push(field(name, schema.properties[name], required.has(name)));
      }
      form.read = () => {
        const out = {};
        let problem = null;
        for (const f of fields) {
          try {
            const v = f.read();
            if (v !== undefined) out[f.dataset.field] = v;
          } catch (err) { problem = problem || err; }
        }
        if (problem) throw problem;
        return out;
      };
    } else {
      fields.push(field("answer", schema || { type: "string" }, true));
      form.read = () => fields[0].read();
    }
    fields.forEach((f) => form.appendChild(f));
    return form;
  }

  /** The editable arguments of an approval, typed after their current values. */
  function editForm(item) {
    const form = el("div", "pf-form");
    const fields = (item.edit || []).map((name) => {
      const value = (item.args || {})[name];
      const type = typeof value === "number" ? "number" : typeof value === "boolean" ? "boolean" : "string";
      // An edited argument keeps a value; its label says it changes the one listed above.
      return field(name, { type: type }, true, value, TEXTS.change_arg.replace("{name}", humanize(name).toLowerCase()));
    });
    fields.forEach((f) => form.appendChild(f));
    form.read = () => {
      const changed = {};
      let problem = null;
      for (const f of fields) {
        try {
          const v = f.read();
          const name = f.dataset.field;
          if (v !== undefined && v !== (item.args || {})[name]) changed[name] = v;
        } catch (err) { problem = problem || err; }
      }
      if (problem) throw problem;
      return Object.keys(changed).length ? Object.assign({}, item.args, changed) : null;
    };
    return form;
  }

  // -- the card ----------------------------------------------------------------------------------

  /** A card for a pending item. opts.canDecide: show the controls (opts.reason: a reason field
   * for approvals); opts.decide(body) sends
   * `{"decision"...}` or `{"answer"...}` and resolves with the turn (or rejects with the server's
   * message, shown in the card; the item stays open). */
  function card(item, opts) {
    const node = el("div", "pending-card");
    node.dataset.item = item.id;
    node.dataset.kind = item.kind;
    node.dataset.state = "open";
    if (confirmation(item)) node.dataset.confirm = "true";
    node.item = item;
    // A confirmation is the runtime's question to the user (yes or no), not someone's approval.
    const kind = confirmation(item) ? "question" : item.kind;
    node.appendChild(el("div", "tag", KIND_TITLE[kind] ? TEXTS[KIND_TITLE[kind]] : humanize(kind)));
    node.appendChild(el("div", "pending-ask", item.ask));
    if (item.args && Object.keys(item.args).length) {
      const list = el("dl", "fields pending-args");
      for (const key of Object.keys(item.args)) {
        list.appendChild(el("dt", "", humanize(key)));
        const dd = list.appendChild(el("dd", "", plain(item.args[key])));
        dd.dataset.arg = key;
        dd.dataset.was = plain(item.args[key]);
      }
      node.appendChild(list);
    }
    const status = el("div", "pending-status");
    status.setAttribute("role", "status");
    const problem = el("div", "pending-problem");
    problem.setAttribute("role", "alert");
    if (item.held) { // decided while an operator holds the conversation: applies on release
      node.dataset.state = "held";
      status.textContent = heldText(item.held);
    } else if (opts.canDecide && item.kind !== "takeover") {
      node.appendChild(controls(item, opts, problem));
    } else {
      status.textContent = TEXTS[WAITING[item.kind] || "waiting_answer"];
    }
    node.appendChild(problem);
    node.appendChild(status);
    return node;
  }

  /** "Approved by ops: applies when the conversation is released" (an item's `held`: {kind, by, at}). */
  function heldText(held) {
    const outcome = { approve: "approved", reject: "rejected", answer: "answered", timeout: "timed_out" }[held.kind] || held.kind;
    const by = held.by ? " " + TEXTS.by.split("{name}").join(shown(holder(held))) : "";
    return (TEXTS[outcome] || humanize(String(outcome))) + by + ": " + TEXTS.held_note;
  }

  function controls(item, opts, problem) {
    const box = el("div", "pending-controls");
    const buttons = el("div", "pending-buttons");
    const send = async (body, button) => {
      problem.textContent = "";
      const all = box.querySelectorAll("button, input, select");
      all.forEach((b) => { b.disabled = true; });
      if (button) button.classList.add("picked");
      try {
        await opts.decide(body);
      } catch (err) {
        problem.textContent = err.message || String(err);
        all.forEach((b) => { b.disabled = false; });
        if (button) button.classList.remove("picked");
      }
    };
    const button = (label, cls, onClick) => {
      const b = el("button", "btn " + cls, label);
      b.type = "button";
      b.addEventListener("click", () => onClick(b));
      buttons.appendChild(b);
      return b;
    };
    if (item.kind === "approval") {
      const form = (item.edit || []).length ? editForm(item) : null;
      if (form) box.appendChild(form);
      const reason = opts.reason ? field("reason", { type: "string" }, false, undefined, TEXTS.reason_optional) : null;
      if (reason) box.appendChild(reason);
      const withReason = (body) => {
        const why = reason ? reason.read() : undefined;
        return why ? Object.assign(body, { reason: why }) : body;
      };
      const asked = confirmation(item); // the user's own yes or no: the buttons say Yes and No
      button(asked ? asked.yes : TEXTS.approve, "primary approve", (b) => {
        let args = null;
        try { args = form ? form.read() : null; } catch (err) { return; } // the field says why
        send(withReason(args ? { decision: "approve", args: args } : { decision: "approve" }), b);
      });
      button(asked ? asked.no : TEXTS.reject, "reject", (b) => send(withReason({ decision: "reject" }), b));
    } else if (item.choices && item.choices.length) {
      for (const choice of item.choices) {
        const b = button(choice.label, "choice", (picked) => send({ answer: choice.value }, picked));
        b.dataset.value = JSON.stringify(choice.value);
      }
    } else {
      const form = schemaForm(item.schema);
      box.appendChild(form);
      button(TEXTS.answer, "primary answer", (b) => {
        let value;
        try { value = form.read(); } catch (err) { return; } // each field says why
        send({ answer: value }, b);
      });
    }
    box.appendChild(buttons);
    return box;
  }


  /** The card once its Resolved event came: who decided what; no more controls. */
  function resolve(node, resolved) {
    node.dataset.state = "resolved";
    node.dataset.outcome = resolved.outcome;
    const controls = node.querySelector(".pending-controls");
    if (controls) controls.remove();
    node.querySelector(".pending-problem").textContent = "";
    // A confirmation says what the user answered, Yes or No (only they decide it: no "by").
    const asked = confirmation(node.item || {});
    const said = asked && { approved: asked.yes, rejected: asked.no }[resolved.outcome];
    let text = said || ((TEXTS[resolved.outcome] || humanize(resolved.outcome))
      + (resolved.by ? " " + TEXTS.by.split("{name}").join(resolved.by) : ""));
    if (resolved.outcome === "edited" && resolved.args) {
      for (const key of Object.keys(resolved.args)) {
        const dd = node.querySelector('.pending-args dd[data-arg="' + CSS.escape(key) + '"]');
        if (dd && dd.textContent !== plain(resolved.args[key])) {
          dd.textContent = "";
          dd.appendChild(el("s", "", dd.dataset.was || ""));
          dd.appendChild(el("span", "edited", plain(resolved.args[key])));
        }
      }
    }
    if (resolved.answer !== undefined) text += ": " + answerText(resolved.answer, node.item || {});
    if (resolved.reason) text += " (" + resolved.reason + ")";
    node.querySelector(".pending-status").textContent = text;
  }

  /** An answer as people read it: a choice's label; an object's fields with the schema's titles. */
  function answerText(answer, item) {
    const choice = (item.choices || []).find((c) => JSON.stringify(c.value) === JSON.stringify(answer));
    if (choice) return choice.label;
    if (answer && typeof answer === "object" && !Array.isArray(answer)) {
      const props = (item.schema && item.schema.properties) || {};
      return Object.keys(answer).map((k) => ((props[k] && props[k].title) || humanize(k)) + " " + plain(answer[k])).join(" · ");
    }
    return plain(answer);
  }

  /** Who holds a taken conversation (`taken_over`), by the name the user reads in its notices:
   * one taken with no one signed in (a server without --auth: `by` null) is the engine's
   * "operator" (engine/waiting.py, _operator_name). */
  function holder(taken) {
    const by = taken ? taken.by : null;
    return (by && typeof by === "object" ? by.name : by) || UNNAMED;
  }

  /** The data's stand-in for an operator with no name (page_texts.py UNNAMED_OPERATOR): kept as
   * data, never shown; `shown` gives the locale's `operator_unnamed` for it. */
  const UNNAMED = "operator";

  function unnamed(name) {
    return !name || name === UNNAMED;
  }

  /** An operator's name as a user reads it alone ("by olga", "by an operator"). */
  function shown(name) {
    return unnamed(name) ? TEXTS.operator_unnamed : name;
  }

  window.ChatrunPending = { card: card, holder: holder, unnamed: unnamed, shown: shown, resolve: resolve, schemaForm: schemaForm, plain: plain, setTexts: setTexts,
    confirmation: confirmation };
})();
