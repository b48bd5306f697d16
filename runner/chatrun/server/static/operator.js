/* The operator inbox (/operator; docs/operators.md). The list: every conversation waiting for a
 * person, newest activity first (GET /pending?order=recent, 50 a page, "More" adds one), with
 * the customer, their last message, the wait and the kind; pushed by the server
 * (GET /pending/stream, server-sent events) with a 3 s poll as the fallback. A title badge
 * "(3) Inbox" counts the conversations nobody has taken; browser notifications (asked on a
 * click) and a sound (opt-in) tell of new activity. One conversation: its history, its open
 * items as cards, typing both ways, and the composer at the bottom with the bot's canned
 * replies (`canned:`). The history's time stamps use Intl in the session's locale; the times and
 * counts in the page's own sentences, in the page's. Needs a token with the role `operators`
 * (?token=… once, kept for the tab). Its own texts come with the page in the operator's language
 * (site.py `_operator_texts`; definition/page_texts.py, the `op_*` keys; a catalog's `page.<key>`
 * overrides them); a conversation's cards are in its own bot's texts (`botTexts`); the inspector's
 * labels stay English, as on the chat page. */
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
  const PREFS_KEY = "chatrun:" + location.host + ":inbox";
  const prefs = JSON.parse(localStorage.getItem(PREFS_KEY) || "{}"); // {notify, sound}
  const $ = (id) => document.getElementById(id);
  const PAGE = 50;
  const TYPING_PING = 3000; // ms between two "I am typing" pings (the server keeps one 6 s)
  let open = null; // {bot, id, owner, mark, routes, canned, locale}
  let pages = 1;
  let listTimer = null;
  let sessionTimer = null;
  let stream = null;
  let known = null; // session -> the time of its last activity, as last seen (null: the first load)
  let lastPing = 0;
  let you = null; // the viewer's name, as GET /pending says it (null: no one signed in)
  // A message whose POST got no answer (the network failed: the server may have committed it),
  // back in the box with its Idempotency-Key: sent again unchanged, it goes with the same key, so
  // the server answers from its commit instead of the user reading it twice.
  let unsent = null; // {session, text, key}
  const pageData = JSON.parse($("page-data").textContent);

  /** The page's text `key` (definition/page_texts.py, or the bot's `page.<key>`), `{name}`s filled. */
  function tx(key, args) {
    let text = pageData.texts[key] !== undefined ? pageData.texts[key] : key;
    for (const name in args || {}) text = text.split("{" + name + "}").join(String(args[name]));
    return text;
  }

  /** The texts of a conversation of `bot`: its own bot's where they differ from the page's (the
   * operator's language, site.py `_bots_texts`): its cards and decisions read as that bot words them. */
  function botTexts(bot) {
    return Object.assign({}, pageData.texts, (pageData.bots || {})[bot] || {});
  }

  /** The texts of the page's own HTML (`data-page-text`, `data-page-label`) and the cards'. */
  function applyPageTexts() {
    document.querySelectorAll("[data-page-text]").forEach((node) => { node.textContent = tx(node.dataset.pageText); });
    document.querySelectorAll("[data-page-label]").forEach((node) => { node.setAttribute("aria-label", tx(node.dataset.pageLabel)); });
    ChatrunPending.setTexts(pageData.texts);
  }

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
    let r;
    try {
      r = await fetch(path, opts);
    } catch (err) { // no answer at all: the server is away (err.offline), not a refusal
      err.offline = true;
      throw err;
    }
    const body = await r.json().catch(() => ({}));
    if (!r.ok) {
      const err = new Error(body.message || r.statusText);
      err.status = r.status;
      err.code = body.error; // e.g. HeldByAnother: another operator holds the conversation
      throw err;
    }
    return body;
  }

  /** The page's state in the top bar, a live region: written only when it changes, so a screen
   * reader says "server unreachable" once, not at every poll (every 3 s) while the server is away. */
  function setStatus(state, text) {
    const status = $("status");
    if (status.dataset.state === state && status.textContent === text) return;
    status.dataset.state = state;
    status.textContent = text;
  }

  function sessionPath(bot, id) {
    return "/bots/" + encodeURIComponent(bot) + "/sessions/" + encodeURIComponent(id);
  }

  // -- Intl: times and counts as a locale writes them -------------------------------------------

  function ago(ms, locale) {
    const s = Math.round((ms - Date.now()) / 1000); // negative: in the past
    const rtf = new Intl.RelativeTimeFormat(locale || undefined, { numeric: "auto", style: "short" });
    if (Math.abs(s) < 60) return rtf.format(s, "second");
    if (Math.abs(s) < 3600) return rtf.format(Math.round(s / 60), "minute");
    if (Math.abs(s) < 86400) return rtf.format(Math.round(s / 3600), "hour");
    return rtf.format(Math.round(s / 86400), "day");
  }

  function waited(iso, locale) {
    const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
    const [n, unit] = s < 60 ? [s, "second"] : s < 3600 ? [s / 60, "minute"] : s < 86400 ? [s / 3600, "hour"] : [s / 86400, "day"];
    return new Intl.NumberFormat(locale || undefined, { style: "unit", unit: unit, unitDisplay: "short", maximumFractionDigits: 0 }).format(n);
  }

  function clock(ms, locale) {
    return new Intl.DateTimeFormat(locale || undefined, { dateStyle: "medium", timeStyle: "short" }).format(new Date(ms));
  }

  // -- the list ---------------------------------------------------------------------------------

  function listQuery(extra) {
    const query = new URLSearchParams(Object.assign({ limit: String(PAGE), order: "recent" }, extra || {}));
    const kind = $("kind-filter").value;
    if (kind) query.set("kind", kind);
    return query;
  }

  /** The pages shown, read with GET /pending (the poll, "More", and after an action). */
  async function refreshList() {
    clearTimeout(listTimer);
    try {
      let sessions = [];
      let cursor = null;
      for (let page = 0; page < pages; page++) {
        const data = await call("/pending?" + listQuery(cursor ? { cursor: cursor } : null).toString());
        you = data.you === undefined ? you : data.you;
        sessions = sessions.concat(data.sessions || []);
        cursor = data.next || null;
        if (!cursor) break;
      }
      shown(sessions, Boolean(cursor));
    } catch (err) {
      if (err.status === 401 || err.status === 403) return refused(err);
      setStatus("offline", tx("unreachable"));
    }
    if (!stream) listTimer = setTimeout(refreshList, 3000); // the fallback while no stream is open
  }

  /** The server pushes the first page whenever it changes (GET /pending/stream). */
  function openStream() {
    if (stream) stream.close();
    stream = null;
    if (!window.EventSource) return refreshList();
    const query = listQuery();
    if (TOKEN) query.set("token", TOKEN); // an EventSource sends no Authorization header
    const source = new EventSource("/pending/stream?" + query.toString());
    source.addEventListener("inbox", (ev) => {
      stream = source;
      clearTimeout(listTimer);
      document.body.dataset.channel = "push";
      if (pages > 1) return refreshList(); // the later pages are read as before
      const data = JSON.parse(ev.data);
      you = data.you === undefined ? you : data.you;
      shown(data.sessions || [], Boolean(data.next));
    });
    source.onerror = () => { // refused, or the server went away: poll, and try the stream again later
      source.close();
      stream = null;
      document.body.dataset.channel = "poll";
      refreshList();
      setTimeout(() => { if (!stream && !$("unauthorized")) openStream(); }, 15000);
    };
  }

  function shown(sessions, more) {
    renderList(sessions, more);
    announce(sessions);
    setStatus("online", tx("op_live"));
    document.body.dataset.ready = "true";
  }

  function refused(err) {
    if (stream) stream.close();
    stream = null;
    setStatus("offline", tx("op_unauthorized"));
    const box = $("sessions");
    box.textContent = "";
    const notice = el("li", "notice error", tx("op_refused", { problem: err.message }));
    notice.id = "unauthorized";
    box.appendChild(notice);
    document.body.dataset.ready = "true";
  }

  function customer(s) {
    return s.owner || tx("op_visitor", { id: String(s.session).slice(0, 6) });
  }

  /** The list is drawn anew on every push or poll: the row (or "More") that had the keyboard's
   * focus has it again, so an operator moving through the list is not sent back to the top. */
  function renderList(sessions, more) {
    const box = $("sessions");
    const had = box.contains(document.activeElement) ? document.activeElement : null;
    drawList(box, sessions, more);
    if (!had) return;
    const again = had.id ? $(had.id) : Array.from(box.querySelectorAll(".op-session"))
      .find((row) => row.dataset.bot === had.dataset.bot && row.dataset.session === had.dataset.session);
    if (again) again.focus({ preventScroll: true });
  }

  function drawList(box, sessions, more) {
    box.textContent = "";
    if (!sessions.length) box.appendChild(el("li", "op-none", tx("op_nobody")));
    for (const s of sessions) box.appendChild(renderRow(s));
    if (more) {
      const item = el("li");
      const next = el("button", "op-more", tx("op_more"));
      next.type = "button";
      next.id = "more-sessions";
      next.addEventListener("click", () => { pages += 1; refreshList(); });
      item.appendChild(next);
      box.appendChild(item);
    }
    const open_ = sessions.filter((s) => !s.taken_over).length;
    $("count").textContent = open_ ? String(open_) : "";
    document.title = (open_ ? "(" + open_ + ") " : "") + tx("op_inbox") + " · chatrun";
  }

  function renderRow(s) {
    const item = el("li");
    const current = open && open.id === s.session && open.bot === s.bot;
    const last = s.last || null;
    const unread = last && last.from === "user" && !current && seenAt(s) < last.at;
    const row = el("button", "op-session" + (current ? " current" : "") + (unread ? " unread" : ""));
    row.type = "button";
    row.dataset.session = s.session;
    row.dataset.bot = s.bot;
    const name = customer(s);
    const avatar = el("span", "op-avatar", name.slice(0, 1).toUpperCase());
    avatar.setAttribute("aria-hidden", "true");
    row.appendChild(avatar);
    row.appendChild(el("span", "op-who", name));
    const when = el("span", "op-when", last ? ago(last.at * 1000, pageData.lang) : "");
    if (last) when.title = clock(last.at * 1000, pageData.lang);
    row.appendChild(when);
    row.appendChild(el("span", "op-last", lastLine(s)));
    const kinds = el("span", "op-kinds");
    for (const it of s.items) {
      const chip = el("span", "op-kind " + it.kind, tx("op_chip_" + it.kind, { waited: waited(it.created, pageData.lang) }));
      chip.title = it.ask;
      kinds.appendChild(chip);
    }
    if (s.taken_over) kinds.appendChild(el("span", "op-kind taken", tx("op_with", { name: ChatrunPending.shown(ChatrunPending.holder(s.taken_over)) })));
    row.appendChild(kinds);
    row.addEventListener("click", () => openSession(s.bot, s.session, s.owner));
    item.appendChild(row);
    return item;
  }

  function lastLine(s) {
    const last = s.last;
    if (last && last.from === "user" && last.text) return last.text;
    if (last && last.from === "operator") return sender(last, s) + ": " + last.text;
    return s.items.length ? s.items[0].ask : last ? last.text : "";
  }

  /** Who sent an operator's last message: "You" when it is the viewer (by name, as the server
   * tells principals apart), else that operator's name (`last.by`; a page stored before it was
   * kept: the holder's, who alone may speak). */
  function sender(last, s) {
    const by = "by" in last ? last.by : s.taken_over && s.taken_over.by ? ChatrunPending.holder(s.taken_over) : null;
    return by === you ? tx("op_you") : ChatrunPending.shown(by);
  }

  function seenAt(s) {
    const seen = JSON.parse(sessionStorage.getItem(PREFS_KEY + ":seen") || "{}");
    return seen[s.bot + "/" + s.session] || 0;
  }

  function markSeen(bot, id, at) {
    const seen = JSON.parse(sessionStorage.getItem(PREFS_KEY + ":seen") || "{}");
    seen[bot + "/" + id] = at;
    sessionStorage.setItem(PREFS_KEY + ":seen", JSON.stringify(seen));
  }

  // -- notifications, badge sound ---------------------------------------------------------------

  /** Tell of activity that is new since the last page: a notification and a sound, if asked. */
  function announce(sessions) {
    const news = [];
    const now = {};
    for (const s of sessions) {
      const key = s.bot + "/" + s.session;
      const at = s.last ? s.last.at : 0;
      now[key] = at;
      const fresh = known !== null && (!(key in known) || at > known[key]);
      const theirs = !s.last || s.last.from !== "operator";
      if (fresh && theirs && !(open && open.bot === s.bot && open.id === s.session && !document.hidden)) news.push(s);
    }
    known = Object.assign(known || {}, now);
    if (!news.length) return;
    document.body.dataset.news = String(Number(document.body.dataset.news || 0) + news.length);
    const s = news[0];
    const title = news.length > 1 ? tx("op_note_more", { name: customer(s), count: news.length - 1 })
      : tx("op_note_waiting", { name: customer(s) });
    // Read out by a screen reader (the list itself is no live region: it is drawn anew each time).
    $("op-announce").replaceChildren(el("p", "", title + ": " + lastLine(s)));
    if (prefs.notify && window.Notification && Notification.permission === "granted") {
      const note = new Notification(title,
        { body: lastLine(s), tag: "chatrun-inbox" });
      note.onclick = () => { window.focus(); openSession(s.bot, s.session, s.owner); note.close(); };
    }
    if (prefs.sound) chime();
  }

  function chime() {
    try {
      const Ctx = window.AudioContext || window.webkitAudioContext;
      const ctx = chime.ctx || (chime.ctx = new Ctx());
      const tone = ctx.createOscillator();
      const gain = ctx.createGain();
      tone.frequency.value = 880;
      gain.gain.setValueAtTime(0.12, ctx.currentTime);
      gain.gain.exponentialRampToValueAtTime(0.001, ctx.currentTime + 0.35);
      tone.connect(gain).connect(ctx.destination);
      tone.start();
      tone.stop(ctx.currentTime + 0.35);
    } catch (err) { /* no audio: the badge and the notification still tell */ }
  }

  function savePrefs() {
    localStorage.setItem(PREFS_KEY, JSON.stringify(prefs));
    showNotify();
    $("sound").checked = Boolean(prefs.sound);
  }

  // Notify me's states and their words: the browser blocks this site's notifications (asked and
  // refused, or refused in its settings, as it is when the page loads) or has none at all: no alert
  // comes, and the button says so, on a phone too (its word hidden there: an icon with a slash and
  // a short visible badge, aria-hidden, so a screen reader hears the state once, as its name).
  const NOTIFY_WORDS = { on: "op_notifying", off: "op_notify", blocked: "op_notify_blocked", none: "op_notify_none" };
  let notifyTried = false; // "none" is said once Notify me was pressed (a browser without notifications)

  function showNotify() {
    const permission = window.Notification ? Notification.permission : null;
    const state = permission === "denied" ? "blocked" : !permission && notifyTried ? "none"
      : prefs.notify && permission === "granted" ? "on" : "off";
    $("notify").dataset.state = state;
    $("notify").setAttribute("aria-pressed", String(state === "on"));
    $("notify-word").textContent = tx(NOTIFY_WORDS[state]);
  }

  $("notify").addEventListener("click", async () => {
    if (prefs.notify) { prefs.notify = false; return savePrefs(); }
    notifyTried = true;
    if (!window.Notification) return showNotify();
    const answer = Notification.permission === "granted" ? "granted" : await Notification.requestPermission();
    prefs.notify = answer === "granted";
    savePrefs();
  });
  $("sound").addEventListener("change", () => { prefs.sound = $("sound").checked; savePrefs(); if (prefs.sound) chime(); });

  // -- one conversation -------------------------------------------------------------------------

  async function openSession(bot, id, owner) {
    stopTyping();
    open = { bot: bot, id: id, owner: owner || null, mark: null, routes: [], canned: [], locale: null };
    const current = open;
    document.body.classList.add("op-open");
    const [info, canned] = await Promise.all([
      call("/bots/" + encodeURIComponent(bot)).catch(() => null),
      call(sessionPath(bot, id) + "/canned").catch(() => ({ canned: [] })),
    ]);
    current.routes = info ? info.graph.nodes.map((n) => n.name) : [];
    current.canned = canned.canned || [];
    await refreshSession();
    if (current === open && $("op-detail-title")) focusDetail();
    refreshList();
  }

  async function refreshSession() {
    clearTimeout(sessionTimer);
    if (!open) return;
    const current = open;
    try {
      const data = await call(sessionPath(current.bot, current.id));
      if ($("status").textContent === tx("unreachable")) setStatus("online", tx("op_live")); // it answers again
      // Redrawn only when a turn was made: an operator typing keeps what they typed.
      const mark = JSON.stringify([data.turn, data.taken_over, (data.pending || []).map((i) => i.id)]);
      if (current === open && mark !== current.mark) {
        const inspect = await call(sessionPath(current.bot, current.id) + "/inspect").catch(() => null);
        current.mark = mark;
        current.locale = data.locale || null;
        renderSession(data, inspect);
        const history = data.history || [];
        if (history.length) markSeen(current.bot, current.id, history[history.length - 1].at || Date.now() / 1000);
      }
      if (current === open) showTyping(await call(sessionPath(current.bot, current.id) + "/typing").catch(() => null));
    } catch (err) {
      if (err.offline) setStatus("offline", tx("unreachable")); // the server is away: keep what is shown
      else if (current === open) { current.mark = null; renderProblem(err); } // redrawn once it answers again
    }
    if (current === open) sessionTimer = setTimeout(refreshSession, 1500);
  }

  /** The server's refusal in place of the conversation, with the way back to the list (a phone
   * shows no list beside it). A conversation that is gone (deleted: 404) says so in the page's own
   * words, in the operator's language; the server's message is for developers. */
  function renderProblem(err) {
    const text = err.status === 404 ? tx("op_gone") : err.message;
    const box = $("detail");
    box.textContent = "";
    box.removeAttribute("data-session");
    const problem = box.appendChild(el("div", "op-problem"));
    problem.appendChild(backButton());
    problem.appendChild(el("div", "notice error", text));
  }

  function renderSession(data, inspect) {
    const box = $("detail");
    const typing = $("operator-input");
    const draft = typing && box.dataset.session === data.id ? typing.value : null;
    const had = box.contains(document.activeElement) ? document.activeElement : null;
    const scroller = box.querySelector(".op-scroll");
    const atBottom = !scroller || scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight < 40;
    const asideOpen = box.classList.contains("aside-open");
    box.textContent = "";
    box.className = "op-detail has-aside" + (asideOpen ? " aside-open" : "");
    box.dataset.session = data.id;
    box.dataset.turn = String(data.turn);
    ChatrunPending.setTexts(botTexts(data.bot)); // the cards and outcomes below, in the conversation's bot's texts
    const conv = el("div", "op-conv");
    conv.appendChild(renderHead(data));
    const scroll = el("div", "op-scroll");
    scroll.appendChild(renderHistory(data.history || [], data.locale));
    scroll.appendChild(renderCards(data));
    conv.appendChild(scroll);
    const typingLine = el("div", "op-typing");
    typingLine.id = "user-typing";
    typingLine.setAttribute("aria-live", "polite");
    conv.appendChild(typingLine);
    conv.appendChild(renderComposer(data));
    box.appendChild(conv);
    box.appendChild(renderInspector(data, inspect));
    if (atBottom) scroll.scrollTop = scroll.scrollHeight;
    const input = $("operator-input");
    if (input && draft) input.value = draft;
    // Drawn anew: the control the keyboard was on has the focus again (else the conversation's name).
    if (had) ((had.id && $(had.id)) || $("op-detail-title")).focus({ preventScroll: true });
  }

  /** The focus where the keyboard can go on from: the conversation's name once it is open, unless
   * the control the keyboard is on is still shown (on a phone the list it was in is hidden). */
  function focusDetail() {
    const at = document.activeElement;
    if (!at || at === document.body || !at.getClientRects().length) $("op-detail-title").focus({ preventScroll: true });
  }

  /** Back to the list (a phone's "‹ List"): the focus on the row of the conversation just left. */
  function backToList() {
    const left = open;
    stopTyping();
    open = null;
    document.body.classList.remove("op-open");
    const row = left && Array.from(document.querySelectorAll(".op-session"))
      .find((r) => r.dataset.bot === left.bot && r.dataset.session === left.id);
    if (row) row.focus({ preventScroll: true });
    refreshList();
  }

  /** A phone's "‹ List" (hidden where the list is beside the conversation). */
  function backButton() {
    const back = el("button", "btn op-back", tx("op_back"));
    back.type = "button";
    back.addEventListener("click", backToList);
    return back;
  }

  function renderHead(data) {
    const head = el("div", "op-detail-head");
    head.appendChild(backButton());
    const title = el("div", "op-head-title");
    const name = title.appendChild(el("h2", "", open.owner || tx("op_visitor", { id: data.id.slice(0, 6) })));
    name.id = "op-detail-title";
    name.tabIndex = -1; // focused when the conversation opens, so the keyboard and a screen reader start there
    title.appendChild(el("div", "op-sub", [data.bot, data.id, tx("op_on_route", { route: data.route }), turns(data.turn)]
      .concat(data.locale ? [data.locale] : []).join(" · ")));
    head.appendChild(title);
    const actions = el("div", "op-head-actions");
    if (data.taken_over && !data.heldByAnother) { // only the holder releases it
      const to = el("select");
      to.id = "release-route";
      to.setAttribute("aria-label", tx("op_release_to"));
      to.appendChild(el("option", "", tx("op_release_back"))).value = "";
      for (const r of open.routes || []) to.appendChild(el("option", "", tx("op_release_route", { route: r }))).value = r;
      const button = el("button", "btn", tx("op_release"));
      button.id = "release";
      button.type = "button";
      button.addEventListener("click", () => { stopTyping(); act("/release", to.value ? { route: to.value } : {}); });
      actions.appendChild(to);
      actions.appendChild(button);
    }
    const details = el("button", "btn op-aside-toggle", tx("op_details"));
    details.type = "button";
    details.setAttribute("aria-controls", "op-inspector");
    details.addEventListener("click", () => $("detail").classList.toggle("aside-open"));
    actions.appendChild(details);
    head.appendChild(actions);
    return head;
  }

  /** "3 turns", by the plural rule of the page's language (`op_turns_one`, `op_turns_other`). */
  function turns(n) {
    const form = new Intl.PluralRules(pageData.lang).select(n) === "one" ? "op_turns_one" : "op_turns_other";
    return tx(form, { n: new Intl.NumberFormat(pageData.lang).format(n) });
  }

  /** The open items with their controls (an item only its user or a backend decides: shown, without). */
  function renderCards(data) {
    const box = el("div", "op-actions");
    const own = (pageData.botLangs || {})[data.bot]; // the cards are in their bot's language, and its direction
    if (own) { box.lang = own.lang; box.dir = own.dir; }
    for (const item of data.pending || []) {
      if (item.kind === "takeover") continue;
      const ours = (item.by || []).some((role) => role !== "user" && role !== "backend");
      box.appendChild(ChatrunPending.card(item, { canDecide: ours, reason: true, decide: (body) => decide(item.id, body) }));
    }
    return box;
  }

  /** At the bottom: Take over, or (once taken) the canned replies and the operator's message. */
  function renderComposer(data) {
    const box = el("div", "op-composer");
    const problem = el("div", "pending-problem");
    problem.id = "action-problem";
    problem.setAttribute("role", "alert");
    if (data.heldByAnother) { // another operator holds it: the server refuses our actions (409 HeldByAnother)
      const held = el("div", "op-with", tx("op_held_by", { name: data.heldByAnother,
        ago: ago(Date.parse(data.taken_over.since), pageData.lang) }));
      held.id = "held-by";
      box.appendChild(held);
      box.appendChild(forceButton(data.heldByAnother)); // unless they went home without releasing it
      box.appendChild(problem);
      return box;
    }
    if (!data.taken_over) {
      const bar = el("div", "op-takebar");
      const take = el("button", "btn primary", tx("op_take_over"));
      take.id = "take-over";
      take.type = "button";
      take.addEventListener("click", () => act("/takeover", {}));
      bar.appendChild(take);
      const waits = (data.pending || []).find((i) => i.kind === "takeover");
      bar.appendChild(el("span", "op-sub", waits ? tx("op_asked_person", { ask: waits.ask }) : tx("op_bot_answers")));
      box.appendChild(bar);
      box.appendChild(problem);
      return box;
    }
    const since = Date.parse(data.taken_over.since);
    box.appendChild(el("div", "op-with", tx("op_you_have", { ago: ago(since, pageData.lang) })));
    const say = el("form", "op-say");
    say.id = "operator-say";
    const input = el("textarea");
    input.rows = 2;
    input.placeholder = tx("op_placeholder");
    input.setAttribute("aria-label", tx("op_message_label"));
    input.id = "operator-input";
    input.addEventListener("input", () => pingTyping(input.value.trim() !== ""));
    input.addEventListener("keydown", (ev) => {
      if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) { ev.preventDefault(); say.requestSubmit(); }
    });
    const send = el("button", "btn primary", tx("send"));
    send.type = "submit";
    say.appendChild(input);
    say.appendChild(send);
    say.addEventListener("submit", (ev) => {
      ev.preventDefault();
      const text = input.value;
      if (!text.trim()) return;
      input.value = "";
      stopTyping();
      const session = open.bot + "/" + open.id;
      const again = unsent && unsent.session === session && unsent.text === text;
      const key = again ? unsent.key : "operator-say-" + Date.now() + "-" + Math.random().toString(36).slice(2);
      act("/operator/messages", { text: text }, key).then((ok) => {
        unsent = ok ? null : { session: session, text: text, key: key };
        if (!ok && !$("operator-input").value) $("operator-input").value = text;
      });
    });
    if (open.canned.length) box.appendChild(renderCanned(input));
    box.appendChild(say);
    box.appendChild(problem);
    return box;
  }

  function renderCanned(input) {
    const row = el("div", "op-canned");
    row.setAttribute("role", "group");
    row.setAttribute("aria-label", tx("op_canned"));
    for (const reply of open.canned) {
      const pick = el("button", "", reply.name);
      pick.type = "button";
      pick.title = reply.text;
      pick.dataset.canned = reply.name;
      pick.addEventListener("click", () => { input.value = reply.text; input.focus(); pingTyping(true); });
      row.appendChild(pick);
    }
    return row;
  }

  // -- typing, both ways ------------------------------------------------------------------------

  function pingTyping(on) {
    if (!open) return;
    const now = Date.now();
    if (on && now - lastPing < TYPING_PING) return;
    if (!on && !lastPing) return;
    lastPing = on ? now : 0;
    call(sessionPath(open.bot, open.id) + "/typing", { method: "POST", body: JSON.stringify({ typing: on, as: "operator" }) })
      .catch(() => {}); // a lost ping is harmless: the next one tells
  }

  function stopTyping() {
    pingTyping(false);
  }

  function showTyping(typing) {
    const line = $("user-typing");
    if (!line) return;
    const text = typing && typing.user ? tx("operator_typing", { name: open.owner || tx("op_the_user") }) : "";
    if (line.textContent !== text) line.textContent = text;
  }

  // -- acting -----------------------------------------------------------------------------------

  async function decide(item, body) {
    await call(sessionPath(open.bot, open.id) + "/pending/" + encodeURIComponent(item), {
      method: "POST", body: JSON.stringify(body),
      headers: { "Idempotency-Key": "operator-" + item + "-" + Date.now() },
    });
    await refreshSession();
    if (current === open && $("op-detail-title")) focusDetail();
    refreshList();
  }

  async function act(path, body, key) {
    try {
      await call(sessionPath(open.bot, open.id) + path, {
        method: "POST", body: JSON.stringify(body),
        headers: { "Idempotency-Key": key || "operator-" + path + "-" + Date.now() },
      });
    } catch (err) {
      $("action-problem").textContent = err.message;
      if (err.code === "HeldByAnother") offerForce();
      return false;
    }
    await refreshSession();
    // Taken over: the focus in the message box, where the operator goes next (the button is gone).
    if (path === "/takeover" && $("operator-input")) $("operator-input").focus();
    refreshList();
    return true;
  }

  /** After a 409 HeldByAnother (the page showed the conversation before another operator took
   * it): the page as it is now, which shows who holds it and offers to take it from them. */
  async function offerForce() {
    const current = open;
    const data = await call(sessionPath(current.bot, current.id)).catch(() => null);
    const problem = $("action-problem");
    if (!data || !data.heldByAnother || current !== open || !problem || $("force-takeover")) return;
    problem.appendChild(forceButton(data.heldByAnother));
  }

  /** "Take over from NAME": the holder may have gone home without releasing, so the operator may
   * take the conversation from them, announced to the user (they read the holder leave and this
   * operator join; POST .../takeover {"force": true}, docs/operators.md). On its own line. */
  function forceButton(holder) {
    const force = el("button", "btn", tx("op_take_from", { name: holder }));
    force.id = "force-takeover";
    force.type = "button";
    force.addEventListener("click", () => { stopTyping(); act("/takeover", { force: true }); });
    const row = el("div", "op-force");
    row.appendChild(force);
    return row;
  }

  /** The conversation as the user saw it, a time stamp where it paused, and what waited for whom. */
  function renderHistory(history, locale) {
    const box = el("div", "op-history messages");
    box.id = "op-history";
    const asked = new Set(); // a Pending goes to the user and to operators: one line each
    let before = 0;
    for (const entry of history) {
      if (entry.at && entry.at - before > 300) box.appendChild(el("div", "stamp", clock(entry.at * 1000, locale)));
      before = entry.at || before;
      const input = entry.input;
      const text = typeof input === "string" ? input : input && input.userMessage;
      if (text) box.appendChild(el("div", "msg user", text));
      const decision = input && input.decision;
      if (decision) box.appendChild(el("div", "route-change", describe(decision)));
      for (const event of entry.events || []) renderEvent(box, event, asked);
    }
    if (!history.length) box.appendChild(el("div", "muted", tx("op_no_turns")));
    return box;
  }

  function renderEvent(box, event, asked) {
    const meta = event.meta || {};
    if (event.type === "Message" && meta.from === "notice") {
      box.appendChild(el("div", "notice-line", String(event.data)));
    } else if (event.type === "Message") {
      const operator = meta.from === "operator";
      const bubble = el("div", "msg bot md" + (operator ? " operator" : ""));
      if (operator) bubble.appendChild(el("div", "from", ChatrunPending.unnamed(meta.name) ? ChatrunPending.shown(null) : tx("op_from", { name: meta.name })));
      bubble.appendChild(ChatrunMarkdown.render(String(event.data)));
      box.appendChild(bubble);
    } else if (event.type === "Pending" && !asked.has(event.data.id)) {
      asked.add(event.data.id);
      box.appendChild(el("div", "note", tx("op_waiting_item", { kind: tx("kind_" + event.data.kind), id: event.data.id, ask: event.data.ask })));
    }
  }

  function describe(decision) {
    const key = { approve: "approved", reject: "rejected", answer: "answered", takeover: "taken",
      operator_say: "op_spoke", release: "released", expire: "timed_out" }[decision.kind];
    const what = key ? tx(key).toLocaleLowerCase(pageData.lang) : decision.kind; // in a line: "rejected p1"
    return what + (decision.item ? " " + decision.item : "");
  }

  function renderInspector(data, inspect) {
    const box = el("aside", "op-inspector");
    box.id = "op-inspector";
    box.setAttribute("aria-label", "Inspector");
    box.dir = "ltr"; // English, left to right, as the chat page's inspector
    const head = box.appendChild(el("div", "op-inspector-head"));
    head.appendChild(el("h3", "", "Inspector"));
    // Under 1100 px the inspector lies over the page, its Details button under it: it closes itself.
    const close = head.appendChild(el("button", "btn op-aside-close", "×"));
    close.type = "button";
    close.setAttribute("aria-label", "Close the inspector");
    close.addEventListener("click", () => {
      $("detail").classList.remove("aside-open");
      const toggle = document.querySelector(".op-aside-toggle");
      if (toggle) toggle.focus({ preventScroll: true });
    });
    box.appendChild(el("div", "small", "route stack: " + (data.stack || []).join(" › ")));
    const state = el("pre", "json");
    state.textContent = JSON.stringify(data.state, null, 2);
    state.tabIndex = 0;
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

  applyPageTexts();
  window.addEventListener("pagehide", stopTyping);
  $("kind-filter").addEventListener("change", () => { pages = 1; openStream(); });
  savePrefs();
  openStream();
})();
