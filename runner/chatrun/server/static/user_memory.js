/* "What BOT remembers about you" on chatrun's page (issue 37; docs/memory.md, "User memory"),
 * built on app.js's window.ChatrunPage like turn_controls.js.
 *
 * For a bot with `user_memory:` and a signed-in reader (the page's token; without one the server
 * answers 403 and nothing is shown), a button in the header opens a dialog listing what the bot
 * keeps of the reader — the summary of earlier conversations (`user_memory.summary:`) and each
 * fact — with "Forget" for each (DELETE /bots/{bot}/user-memory/{fact}) and "Erase everything"
 * (DELETE /bots/{bot}/user-memory), asked once more before it erases. A native modal <dialog>:
 * focus goes into it and back to the button, Escape closes it; what changed is said in a live
 * region. Texts in the session's locale (ChatrunPage.text: definition/page_texts.py). */
(function () {
  "use strict";

  const page = () => window.ChatrunPage;
  const tx = (key, args) => page().text(key, args);
  const BRAIN = '<svg viewBox="0 0 24 24" aria-hidden="true" focusable="false"><path d="M12 3a4 4 0 0 0-4 4v1a4 4 0 0 0 0 8v1a4 4 0 0 0 8 0v-1a4 4 0 0 0 0-8V7a4 4 0 0 0-4-4Zm0 0v18M8 12h2m4 0h2" fill="none" stroke="currentColor" stroke-width="2" stroke-linecap="round" stroke-linejoin="round"/></svg>';

  const style = document.createElement("style");
  style.textContent = [
    ".memory-dialog { width: min(560px, calc(100vw - 24px)); max-height: calc(100dvh - 48px); padding: 0;",
    "  color: var(--ink); background: var(--panel); border: 1px solid var(--line); border-radius: var(--radius); }",
    ".memory-dialog::backdrop { background: rgb(10 14 22 / 55%); }",
    ".memory-head { display: flex; align-items: center; gap: 8px; padding: 14px 16px 8px; }",
    ".memory-head h2 { flex: 1; margin: 0; font-size: 17px; line-height: 1.3; }",
    ".memory-body { padding: 0 16px 16px; overflow-wrap: anywhere; }",
    ".memory-dialog .btn { min-height: 40px; background: var(--panel); color: var(--ink); border-color: #9aa3b5; }",
    ".memory-dialog .btn.danger { background: var(--error); color: #fff; border-color: var(--error); }",
    ".memory-dialog .btn:focus-visible { outline: 3px solid var(--accent); outline-offset: 2px; }",
    ".memory-summary { margin: 4px 0 12px; padding: 10px 12px; background: var(--chip); border-radius: 8px; }",
    ".memory-summary h3 { margin: 0 0 4px; font-size: 14px; }",
    ".memory-summary p { margin: 0 0 8px; white-space: pre-wrap; }",
    ".memory-facts { list-style: none; margin: 0 0 12px; padding: 0; }",
    ".memory-facts li { display: flex; align-items: center; gap: 10px; padding: 8px 0; border-bottom: 1px solid var(--line); }",
    ".memory-facts .fact { color: var(--muted); min-width: 6em; }",
    ".memory-facts .value { flex: 1; }",
    ".memory-head h2:focus { outline: none; }", // focused on opening, for the screen reader: not a control
    ".memory-status { margin: 0 0 8px; color: var(--muted); }",
    ".memory-status:empty { margin: 0; }",
    ".memory-actions, .memory-confirm { display: flex; flex-wrap: wrap; gap: 8px; align-items: center; }",
    ".memory-confirm p { flex-basis: 100%; margin: 0 0 4px; font-weight: 600; }",
  ].join("\n");
  document.head.appendChild(style);

  const button = document.createElement("button");
  button.type = "button";
  button.id = "user-memory";
  button.className = "btn ghost icon";
  button.hidden = true;
  button.setAttribute("aria-haspopup", "dialog");
  button.innerHTML = BRAIN;
  document.getElementById("theme").before(button);

  const dialog = document.createElement("dialog");
  dialog.className = "memory-dialog";
  dialog.id = "memory-dialog";
  dialog.setAttribute("aria-labelledby", "memory-title");
  document.body.appendChild(dialog);

  // What just happened, read out by screen readers: one live region for the dialog's life (a region
  // made anew with its text in it is not announced).
  const live = document.createElement("p");
  live.className = "memory-status";
  live.setAttribute("role", "status");

  let title = ""; // the bot's name as the reader sees it
  let kept = []; // [{fact, value, at, summary?}] as GET /user-memory answered

  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function btn(text, cls, onClick, label) {
    const b = el("button", "btn" + (cls ? " " + cls : ""), text);
    b.type = "button";
    if (label) b.setAttribute("aria-label", label);
    b.addEventListener("click", onClick);
    return b;
  }

  const shown = (value) => (typeof value === "string" ? value : JSON.stringify(value));

  /** The button's name in the session's locale (app.js calls the page texts anew on a change). */
  function label() {
    const text = tx("memory_button", { bot: title });
    button.setAttribute("aria-label", text);
    button.title = text;
  }

  // The dialog's frame, made once: its heading, Close, the live region, and the list below them.
  const heading = el("h2");
  heading.id = "memory-title";
  heading.tabIndex = -1; // focused on opening, so a screen reader starts from the title
  const close = btn("", "", () => dialog.close());
  const head = el("div", "memory-head");
  head.append(heading, close);
  const body = el("div", "memory-body");
  const listing = el("div");
  body.append(live, listing);
  dialog.append(head, body);

  /** The dialog's contents from `kept`; `status`: what just happened, read out by the live region;
   * `focus`: where the focus goes ("close"; "first": the listing's first button; "none": where it is;
   * else the title). */
  function render(status, focus) {
    heading.textContent = tx("memory_title", { bot: title });
    close.textContent = tx("memory_close");
    listing.replaceChildren();
    const summary = kept.find((f) => f.summary);
    const facts = kept.filter((f) => !f.summary);
    if (summary) {
      const box = el("section", "memory-summary");
      box.setAttribute("aria-labelledby", "memory-summary-title");
      const sh = el("h3", "", tx("memory_summary"));
      sh.id = "memory-summary-title";
      const text = el("p", "", shown(summary.value));
      text.dir = "auto"; // the model's words, in whatever language the conversation was
      box.append(sh, text,
        btn(tx("memory_forget"), "", () => forget(summary.fact), tx("memory_forget_label", { fact: tx("memory_summary") })));
      listing.appendChild(box);
    }
    if (facts.length) {
      const list = el("ul", "memory-facts");
      for (const f of facts) {
        const item = el("li");
        const value = el("span", "value", shown(f.value));
        value.dir = "auto";
        item.append(el("span", "fact", f.fact), value,
          btn(tx("memory_forget"), "", () => forget(f.fact), tx("memory_forget_label", { fact: f.fact })));
        list.appendChild(item);
      }
      listing.appendChild(list);
    }
    if (!kept.length) listing.appendChild(el("p", "memory-empty", tx("memory_empty", { bot: title })));
    else listing.appendChild(actions());
    live.textContent = status || "";
    if (focus === "none") return;
    (focus === "close" ? close : focus === "first" ? listing.querySelector("button") || heading : heading).focus();
  }

  /** "Erase everything", then the question whether to (its Cancel comes back here). */
  function actions() {
    const row = el("div", "memory-actions");
    const erase = btn(tx("memory_erase_all"), "danger", () => {
      const ask = el("div", "memory-confirm");
      ask.setAttribute("role", "group");
      const question = el("p", "", tx("memory_erase_confirm", { bot: title }));
      question.id = "memory-confirm-text";
      ask.setAttribute("aria-labelledby", question.id);
      const yes = btn(tx("memory_erase_yes"), "danger", eraseAll);
      const no = btn(tx("memory_cancel"), "", () => { ask.replaceWith(actions()); dialog.querySelector(".memory-actions .btn").focus(); });
      ask.append(question, yes, no);
      row.replaceWith(ask);
      yes.focus();
    });
    row.appendChild(erase);
    return row;
  }

  async function load() {
    const answer = await page().api("/user-memory");
    kept = answer.facts || [];
  }

  async function forget(fact) {
    try {
      await page().api("/user-memory/" + encodeURIComponent(fact), { method: "DELETE" });
      await load();
      render(tx("memory_erased"), "first");
    } catch (err) {
      render(tx("memory_failed", { problem: err.message }));
    }
  }

  async function eraseAll() {
    try {
      await page().api("/user-memory", { method: "DELETE" });
      await load();
      render(tx("memory_erased"), "close");
    } catch (err) {
      render(tx("memory_failed", { problem: err.message }));
    }
  }

  button.addEventListener("click", async () => {
    let status = "";
    try {
      await load();
    } catch (err) {
      kept = [];
      status = tx("memory_failed", { problem: err.message });
    }
    if (!dialog.open) dialog.showModal();
    render(status);
    button.setAttribute("aria-expanded", "true");
  });
  dialog.addEventListener("close", () => {
    button.setAttribute("aria-expanded", "false");
    button.focus();
  });
  document.addEventListener("chatrun:texts", () => {
    label();
    if (dialog.open) render(live.textContent, "none");
  });

  /** Shown for a bot that remembers its users, to a reader the server knows (GET answers 200). */
  async function start() {
    const info = await page().api("");
    if (!info.user_memory) return;
    title = info.title || page().bot;
    try {
      await load();
    } catch (err) {
      return; // 403: no one signed in, so nothing is kept of this reader
    }
    label();
    button.setAttribute("aria-expanded", "false");
    button.hidden = false;
  }
  start().catch(() => undefined);
})();
