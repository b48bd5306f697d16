/* The operator page (/operator): the sessions waiting for a person (GET /pending), one opened
 * with its history and inspector, its items decided or answered, the conversation taken over,
 * spoken in and released (docs/operators.md). Polls: the list's pages every 3 s (50 sessions a
 * page, "More" shows one more page), the open session every 1.5 s. Needs a token with the role `operators` (?token=… once, kept for the tab). */
(function () {
  "use strict";

  const params = new URLSearchParams(location.search);
  const TOKEN_KEY = "chatrun:" + location.host + ":token"; // the chat page's key: one token per tab
  const TOKEN = params.get("token") || sessionStorage.getItem(TOKEN_KEY);
  if (params.has("token")) {
    if (TOKEN) sessionStorage.setItem(TOKEN_KEY, TOKEN);
    params.delete("token");
    const rest = params.toString();
    history.replaceState(null, "", location.pathname + (rest ? "?" + rest : ""));
  }
  const $ = (id) => document.getElementById(id);
  let open = null; // {bot, id, turn, route}
  let listTimer = null;
  let sessionTimer = null;

  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = text;
    return node;
  }

  async function call(path, options) {
    const opts = Object.assign({ headers: {} }, options || {});
    if (TOKEN) opts.headers.Authorization = "Bearer " + TOKEN;
    if (opts.body) opts.headers["Content-Type"] = "application/json";
    const r = await fetch(path, opts);
    const body = await r.json().catch(() => ({}));
    if (!r.ok) {
      const err = new Error(body.message || r.statusText);
      err.status = r.status;
      throw err;
    }
    return body;
  }

  function setStatus(state, text) {
    $("status").dataset.state = state;
    $("status").textContent = text;
  }

  function age(iso) {
    const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
    if (s < 60) return Math.round(s) + " s";
    if (s < 3600) return Math.round(s / 60) + " min";
    if (s < 86400) return Math.round(s / 3600) + " h";
    return Math.round(s / 86400) + " d";
  }

  function sessionPath(bot, id) {
    return "/bots/" + encodeURIComponent(bot) + "/sessions/" + encodeURIComponent(id);
  }

  // -- the list of waiting sessions -------------------------------------------------------------

  // GET /pending is paged: the list shows `pages` pages of PAGE sessions (the first when it
  // opens; "More" adds one), each poll reading those pages only, never every waiting session.
  const PAGE = 50;
  let pages = 1;

  async function refreshList() {
    clearTimeout(listTimer);
    const kind = $("kind-filter").value;
    try {
      let sessions = [];
      let cursor = null;
      for (let page = 0; page < pages; page++) {
        const query = new URLSearchParams({ limit: String(PAGE) });
        if (kind) query.set("kind", kind);
        if (cursor) query.set("cursor", cursor);
        const data = await call("/pending?" + query.toString());
        sessions = sessions.concat(data.sessions || []);
        cursor = data.next || null;
        if (!cursor) break;
      }
      renderList(sessions, Boolean(cursor));
      setStatus("online", "live");
      document.body.dataset.ready = "true";
    } catch (err) {
      if (err.status === 401 || err.status === 403) return refused(err);
      setStatus("offline", "server unreachable");
    }
    listTimer = setTimeout(refreshList, 3000);
  }

  function refused(err) {
    setStatus("offline", "unauthorized");
    const box = $("sessions");
    box.textContent = "";
    const notice = el("div", "notice error", "This page is for operators: open it with ?token=YOUR_TOKEN at the end of "
      + "its address, a token of the server's --auth file with the role operators. The server said: " + err.message);
    notice.id = "unauthorized";
    box.appendChild(notice);
    document.body.dataset.ready = "true";
  }

  function renderList(sessions, more) {
    const box = $("sessions");
    box.textContent = "";
    if (!sessions.length) box.appendChild(el("div", "muted op-none", "Nobody is waiting."));
    for (const s of sessions) {
      const row = el("button", "op-session" + (open && open.id === s.session && open.bot === s.bot ? " current" : ""));
      row.type = "button";
      row.dataset.session = s.session;
      row.dataset.bot = s.bot;
      const head = el("div", "op-session-head");
      head.appendChild(el("strong", "", s.bot));
      head.appendChild(el("span", "muted", " · " + s.session + (s.owner ? " · " + s.owner : "")));
      row.appendChild(head);
      const kinds = el("div", "op-kinds");
      for (const item of s.items) {
        const chip = el("span", "op-kind " + item.kind, item.kind + " · " + age(item.created));
        chip.title = item.ask;
        kinds.appendChild(chip);
      }
      if (s.taken_over) kinds.appendChild(el("span", "op-kind taken", "with " + (s.taken_over.by.name || s.taken_over.by)));
      row.appendChild(kinds);
      const ask = s.items.length ? s.items[0].ask : "";
      if (ask) row.appendChild(el("div", "op-ask", ask));
      row.addEventListener("click", () => openSession(s.bot, s.session));
      box.appendChild(row);
    }
    if (more) {
      const next = el("button", "op-more", "More waiting sessions");
      next.type = "button";
      next.id = "more-sessions";
      next.addEventListener("click", () => { pages += 1; refreshList(); });
      box.appendChild(next);
    }
  }

  // -- one session ------------------------------------------------------------------------------

  async function openSession(bot, id) {
    open = { bot: bot, id: id, turn: -1, routes: null };
    document.body.classList.add("op-open");
    try {
      const info = await call("/bots/" + encodeURIComponent(bot));
      open.routes = info.graph.nodes.map((n) => n.name);
    } catch (err) { open.routes = []; }
    await refreshSession();
    refreshList();
  }

  async function refreshSession() {
    clearTimeout(sessionTimer);
    if (!open) return;
    const current = open;
    try {
      const data = await call(sessionPath(current.bot, current.id));
      // Redrawn only when a turn was made: an operator editing a form keeps what they typed.
      const mark = JSON.stringify([data.turn, data.lastTurn, data.taken_over, (data.pending || []).map((i) => i.id)]);
      if (current === open && mark !== current.turn) {
        const inspect = await call(sessionPath(current.bot, current.id) + "/inspect").catch(() => null);
        current.turn = mark;
        renderSession(data, inspect);
      }
    } catch (err) {
      renderProblem(err.message);
    }
    if (current === open) sessionTimer = setTimeout(refreshSession, 1500);
  }

  function renderProblem(text) {
    const box = $("detail");
    box.textContent = "";
    box.appendChild(el("div", "notice error", text));
  }

  function renderSession(data, inspect) {
    const box = $("detail");
    // A redraw (the user wrote meanwhile) keeps a half-typed operator message.
    const typing = $("operator-input");
    const draft = typing && box.dataset.session === data.id ? { text: typing.value, focused: document.activeElement === typing } : null;
    box.textContent = "";
    box.dataset.session = data.id;
    box.dataset.turn = String(data.turn);
    const head = el("div", "op-detail-head");
    const back = el("button", "btn ghost op-back", "‹ List");
    back.type = "button";
    back.addEventListener("click", () => { open = null; document.body.classList.remove("op-open"); refreshList(); });
    head.appendChild(back);
    head.appendChild(el("h2", "", data.bot + " · " + data.id));
    head.appendChild(el("span", "muted small", "on " + data.route + " · " + data.turn + (data.turn === 1 ? " turn" : " turns")));
    box.appendChild(head);
    box.appendChild(renderActions(data));
    box.appendChild(renderHistory(data.history || []));
    box.appendChild(renderInspector(data, inspect));
    const input = $("operator-input");
    if (input && draft) {
      input.value = draft.text;
      if (draft.focused) input.focus();
    }
  }

  /** The open items with their controls, and the takeover's: take, speak, release. */
  function renderActions(data) {
    const box = el("div", "op-actions");
    for (const item of data.pending || []) {
      if (item.kind === "takeover") continue;
      // An item only its user (or a backend) decides is shown, without controls.
      const ours = (item.by || []).some((role) => role !== "user" && role !== "backend");
      box.appendChild(ChatrunPending.card(item, { canDecide: ours, reason: true, decide: (body) => decide(item.id, body) }));
    }
    const taken = data.taken_over;
    const bar = el("div", "op-takeover");
    if (!taken) {
      const take = el("button", "btn primary", "Take over");
      take.id = "take-over";
      take.type = "button";
      take.addEventListener("click", () => act("/takeover", {}));
      bar.appendChild(take);
      const waits = (data.pending || []).find((i) => i.kind === "takeover");
      bar.appendChild(el("span", "muted small", waits ? "The user asked for a person: " + waits.ask : "The bot answers until you take over."));
    } else {
      bar.appendChild(el("div", "op-with", "You have this conversation (since " + age(taken.since) + "): the bot is silent."));
      const say = el("form", "op-say");
      say.id = "operator-say";
      const input = el("textarea");
      input.rows = 2;
      input.placeholder = "Type as the operator…";
      input.setAttribute("aria-label", "Operator message");
      input.id = "operator-input";
      const send = el("button", "btn primary", "Send");
      send.type = "submit";
      say.appendChild(input);
      say.appendChild(send);
      say.addEventListener("submit", (ev) => {
        ev.preventDefault();
        const text = input.value;
        if (!text.trim()) return;
        input.value = "";
        act("/operator/messages", { text: text }).then((ok) => { if (!ok && !$("operator-input").value) $("operator-input").value = text; });
      });
      bar.appendChild(say);
      const release = el("div", "op-release");
      const to = el("select");
      to.id = "release-route";
      to.setAttribute("aria-label", "Release to route");
      to.appendChild(el("option", "", "back to where it was")).value = "";
      for (const r of open.routes || []) to.appendChild(el("option", "", "to " + r)).value = r;
      const button = el("button", "btn", "Release");
      button.id = "release";
      button.type = "button";
      button.addEventListener("click", () => act("/release", to.value ? { route: to.value } : {}));
      release.appendChild(button);
      release.appendChild(to);
      bar.appendChild(release);
    }
    const problem = el("div", "pending-problem");
    problem.id = "action-problem";
    bar.appendChild(problem);
    box.appendChild(bar);
    return box;
  }

  async function decide(item, body) {
    await call(sessionPath(open.bot, open.id) + "/pending/" + encodeURIComponent(item), {
      method: "POST", body: JSON.stringify(body),
      headers: { "Idempotency-Key": "operator-" + item + "-" + Date.now() },
    });
    await refreshSession();
    refreshList();
  }

  async function act(path, body) {
    try {
      await call(sessionPath(open.bot, open.id) + path, {
        method: "POST", body: JSON.stringify(body), headers: { "Idempotency-Key": "operator-" + path + "-" + Date.now() },
      });
    } catch (err) {
      $("action-problem").textContent = err.message;
      return false;
    }
    await refreshSession();
    refreshList();
    return true;
  }

  /** The conversation as the user saw it (the user's messages during a takeover are its
   * inputs too; their UserMessage events say the same), and what waited for whom. */
  function renderHistory(history) {
    const box = el("div", "op-history messages");
    box.id = "op-history";
    const asked = new Set(); // a Pending goes to the user and to operators: one line each
    for (const entry of history) {
      const input = entry.input;
      const text = typeof input === "string" ? input : input && input.userMessage;
      if (text) box.appendChild(el("div", "msg user", text));
      const decision = input && input.decision;
      if (decision) box.appendChild(el("div", "route-change", describe(decision)));
      for (const event of entry.events || []) {
        if (event.type === "Message") {
          const operator = event.meta && event.meta.from === "operator";
          const bubble = el("div", "msg bot md" + (operator ? " operator" : ""));
          if (operator) bubble.appendChild(el("div", "from", (event.meta.name || "operator") + " · operator"));
          bubble.appendChild(ChatrunMarkdown.render(String(event.data)));
          box.appendChild(bubble);
        } else if (event.type === "Pending" && !asked.has(event.data.id)) {
          asked.add(event.data.id);
          box.appendChild(el("div", "note", "waiting (" + event.data.kind + " " + event.data.id + "): " + event.data.ask));
        }
      }
    }
    if (!history.length) box.appendChild(el("div", "muted", "No turns yet."));
    return box;
  }

  function describe(decision) {
    const what = { approve: "approved", reject: "rejected", answer: "answered", takeover: "taken over",
      operator_say: "operator spoke", release: "released", expire: "timed out" }[decision.kind] || decision.kind;
    return what + (decision.item ? " " + decision.item : "");
  }

  function renderInspector(data, inspect) {
    const box = el("details", "panel op-inspector");
    box.open = true;
    box.appendChild(el("summary", "", "Inspector"));
    const stack = el("div", "small", "route stack: " + (data.stack || []).join(" › "));
    box.appendChild(stack);
    const state = el("pre", "json");
    state.textContent = JSON.stringify(data.state, null, 2);
    box.appendChild(el("div", "small muted", "conversation state"));
    box.appendChild(state);
    if (inspect && inspect.memory) {
      box.appendChild(el("div", "small muted", "memory of the current route (" + inspect.memory.messages.length + " messages)"));
      for (const m of inspect.memory.messages) {
        const item = el("div", "mem " + m.role);
        item.appendChild(el("div", "role", m.role));
        if (m.content) item.appendChild(el("div", "content", m.content));
        for (const c of m.tool_calls || []) {
          const f = c.function || c;
          item.appendChild(el("div", "call", "→ " + f.name + "(" + f.arguments + ")"));
        }
        box.appendChild(item);
      }
    }
    return box;
  }

  $("kind-filter").addEventListener("change", () => { pages = 1; refreshList(); });
  $("who").textContent = "sessions waiting for a person";
  refreshList();
})();
