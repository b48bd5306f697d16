/* The chatrun web page: a chat on the left, an inspector for bot authors on the right.
 * Plain JavaScript over chatscopes.js; no build step, no network beyond this server.
 *
 * Hooks for other scripts (turn_controls.js: Stop, thumbs up/down), as DOM events (docs/protocol.md,
 * "The page's hooks"):
 *   chatrun:message    on each message element as it is rendered (bubbles up to document);
 *                      detail {role: "bot"|"user"|"operator", text, replayed, turn (a number, or
 *                      null while the turn runs), actions (the message's action bar: append buttons)}.
 *                      A streamed bot reply fires once, when it is complete.
 *   chatrun:turn-start on document when this page starts a turn; detail {chatId}.
 *   chatrun:turn-end   on document when it ends; detail {chatId, ok}.
 *   chatrun:texts      on document when the page's texts changed locale (the session's own).
 * window.ChatrunPage: {bot, mode ("user"|"author"), session() (the chatscopes.js session),
 *   client() (its ChatScopesClient), api(path, options) (fetch under /bots/{bot}, with the token),
 *   text(key, args) (the page's text `key` in the session's locale, `{name}`s filled),
 *   renewToken (null, or a function a wrapper sets that resolves to a fresh token, or null, when
 *   the server refuses the page's: the widget's panel asks the host page; docs/widget.md)}. */
(function () {
  "use strict";

  const BOT = document.body.dataset.bot;
  // "user": the page the bot's users get (/chat/{bot}): the chat alone, no inspector, switcher,
  // route names or brand. "author": the bot author's page with the inspector (/, /bots/{bot}/).
  const MODE = document.body.dataset.mode === "user" ? "user" : "author";
  const params = new URLSearchParams(location.search);
  // The token comes once in the URL (?token=…); it is kept for this tab in sessionStorage and
  // taken out of the address bar, so it does not linger in history, bookmarks or screenshots.
  const TOKEN_KEY = "chatrun:" + location.host + ":token";
  let TOKEN = params.get("token") || sessionStorage.getItem(TOKEN_KEY); // renewed by renewed()
  if (params.has("token")) {
    if (TOKEN) sessionStorage.setItem(TOKEN_KEY, TOKEN);
    params.delete("token");
    const rest = params.toString();
    history.replaceState(null, "", location.pathname + (rest ? "?" + rest : "") + location.hash);
  }
  const STORE_KEY = "chatrun:" + location.host + ":" + BOT + ":chatId";
  const $ = (id) => document.getElementById(id);
  const SVG = "http://www.w3.org/2000/svg";

  const ui = {
    messages: $("messages"), breadcrumb: $("breadcrumb"), thinking: $("thinking"),
    thinkingText: $("thinking-text"), input: $("input"), send: $("send"), status: $("status"), announce: $("announce"),
  };
  // The chat's end: every message goes in before it. While the reader is at the bottom it is the
  // browser's scroll anchor (app.css, .messages > .end), so a growing reply keeps the chat scrolled
  // to the bottom in the browser's own layout, with no script reading the layout on every redraw.
  ui.end = el("div", "end");
  ui.end.setAttribute("aria-hidden", "true");
  ui.messages.appendChild(ui.end);
  let client = null;
  let session = null;
  let busy = false;
  let ended = null; // {route, tool} once an `end` action ended the conversation: no more input
  let streaming = null; // the bot bubble receiving Stream chunks
  let graph = null;
  let selectedRoute = null;
  let inspectData = null;
  let refreshes = 0; // inspector refreshes so far (tests wait on it)
  // Humans in the loop: the cards of pending items by id; the turns shown (others' turns — a
  // supervisor's decision, an operator's message — reach this page by polling the session).
  const cards = new Map();
  const seenTurns = new Set();
  let watching = null; // the polling timer while someone else has to act
  let waitingOnOthers = false;
  let epoch = 0; // bumped by every turn of this page: a poll that overlapped one is dropped
  // A message whose connection closed before its turn ended: {text, turn (the session's before)}
  let lostTurn = null;
  let sessionLocale = ""; // the locale the session speaks (the inspector reads it; docs/i18n.md)

  // -- the page's own texts, in the session's locale (docs/i18n.md, "The page") ----------------

  // Sent with the page (site.py) in the browser's locale; the session's locale replaces them.
  let pageData = JSON.parse($("page-data").textContent);

  /** The page's text `key` (definition/page_texts.py, or the bot's `page.<key>`), `{name}`s filled. */
  function tx(key, args) {
    let text = pageData.texts[key] !== undefined ? pageData.texts[key] : key;
    for (const name in args || {}) text = text.split("{" + name + "}").join(String(args[name]));
    return text;
  }

  /** The text `<key>_one` or `<key>_other` by the plural rule of the page's language, for count `n`
   * ("1 byte", "2 bytes"; as the operator page picks `op_turns_*`, and the server `said_count`). */
  function txCount(key, n, args) {
    let one = n === 1;
    try { one = new Intl.PluralRules(pageData.lang).select(n) === "one"; } catch (err) { /* a tag the browser does not know */ }
    return tx(key + (one ? "_one" : "_other"), args);
  }

  /** Show the page in `data`'s locale (the session's, from the inspector's data): `lang` and
   * `dir` on the document, every control marked `data-page-text`, the cards of pending items. */
  function applyPageTexts(data) {
    if (data) pageData = data;
    const root = document.documentElement;
    root.lang = pageData.lang;
    root.dir = pageData.dir;
    document.querySelectorAll("[data-page-text]").forEach((node) => { node.textContent = tx(node.dataset.pageText); });
    document.querySelectorAll("[data-page-title]").forEach((node) => { node.title = tx(node.dataset.pageTitle); });
    document.querySelectorAll("[data-page-label]").forEach((node) => { node.setAttribute("aria-label", tx(node.dataset.pageLabel)); });
    if (ui.status.dataset.key) ui.status.textContent = tx(ui.status.dataset.key);
    if (!ui.input.disabled) ui.input.placeholder = tx("placeholder");
    else if (ended) ui.input.placeholder = tx("ended_placeholder");
    ChatrunPending.setTexts(pageData.texts);
    ChatrunMarkdown.texts.copy = tx("copy");
    ChatrunMarkdown.texts.copied = tx("copied");
    ChatrunMarkdown.texts.code = tx("code");
    if (MODE === "user") document.title = tx("chat_title");
    showAttachLimits();
    document.querySelectorAll("#attach-tray .attachment").forEach((item) => {
      item.querySelector(".attach-remove").setAttribute("aria-label", tx("remove_file", { name: item.dataset.name }));
    });
    document.dispatchEvent(new CustomEvent("chatrun:texts")); // other scripts' controls follow (user_memory.js)
  }

  /** The status beside the buttons as the page text `key` (kept in its locale by applyPageTexts). */
  function setStatusText(state, key) {
    setStatus(state, tx(key));
    ui.status.dataset.key = key;
  }

  /** The session's inspector data in its locale: the page's texts and the bot's description. */
  function showInLocale(d) {
    applyPageTexts(d.page);
    if (typeof d.description === "string") $("bot-description").textContent = d.description;
  }

  // -- small helpers ------------------------------------------------------------------

  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = text;
    return node;
  }

  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    for (const k in attrs) node.setAttribute(k, attrs[k]);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function api(path, options) {
    const opts = Object.assign({ headers: {} }, options || {});
    if (TOKEN) opts.headers.Authorization = "Bearer " + TOKEN;
    return fetch("/bots/" + encodeURIComponent(BOT) + path, opts).then(async (r) => {
      if (!r.ok) {
        const body = await r.json().catch(() => ({}));
        const err = new Error(body.message || r.statusText);
        err.status = r.status;
        throw err;
      }
      return r.status === 204 ? null : r.json();
    });
  }

  /** JSON as HTML with light syntax colouring (escaped first). */
  function jsonHtml(value) {
    const text = JSON.stringify(value, null, 2);
    if (text === undefined) return "";
    const escaped = text.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
    return escaped.replace(
      /("(?:\\.|[^"\\])*")(\s*:)?|\b(true|false|null)\b|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?/g,
      (m, str, colon, lit) => {
        if (str) return colon ? '<span class="k">' + str + "</span>" + colon : '<span class="s">' + str + "</span>";
        if (lit) return '<span class="z">' + lit + "</span>";
        return '<span class="n">' + m + "</span>";
      }
    );
  }

  // Scroll follows the conversation only while the reader is at its bottom; a reader who
  // scrolled up stays where they are and gets a "↓" button instead.
  let following = true;

  function atBottom() {
    const box = ui.messages;
    return box.scrollHeight - box.scrollTop - box.clientHeight < 48;
  }

  let grewAt = -Infinity; // when the chat last grew (performance.now())

  /** After the chat grew (`force`: and the reader asked to go to the bottom). Growth is followed
   * by the browser's scroll anchoring; where that cannot hold (the chat's first overflow, when
   * the scroll offset is 0, or a browser without anchoring) the end leaving the view while the
   * reader was at the bottom scrolls down (setUpScrolling). */
  function scrollDown(force) {
    grewAt = performance.now();
    if (force) {
      following = true;
      ui.messages.scrollTop = ui.messages.scrollHeight;
      stayAtBottom(3);
    }
    showToBottom(!following);
  }

  /** The chat emptied, but for its end. */
  function clearMessages() {
    ui.messages.replaceChildren(ui.end);
  }

  /** The chat may still grow in the frames after a jump to the bottom (a streaming reply's next
   * redraw, a late layout): follow it for a few frames. */
  function stayAtBottom(frames) {
    requestAnimationFrame(() => {
      if (!following) return;
      const height = ui.messages.scrollHeight;
      ui.messages.scrollTop = height;
      if (frames > 1) stayAtBottom(frames - 1);
    });
  }

  /** The "↓" button, touched only when it changes: a streaming reply scrolls several times a second. */
  function showToBottom(on) {
    const button = $("to-bottom");
    if (button.hidden === on) button.hidden = !on;
  }

  function add(node) {
    const empty = ui.messages.querySelector(":scope > .empty");
    if (empty) empty.remove();
    ui.messages.insertBefore(node, ui.end);
    scrollDown();
    return node;
  }

  function plural(n, word) { return n + " " + word + (n === 1 ? "" : "s"); }

  /** Without a valid token nothing can work: say so in full where the chat would be, and
   * disable the input rather than let messages fail one by one. */
  function showUnauthorized(detail) {
    setStatus("offline", "unauthorized");
    ui.input.disabled = true;
    ui.send.disabled = true;
    const notice = el("div", "notice error");
    notice.id = "unauthorized";
    if (MODE === "user") {
      // An end user (or a widget's visitor, whose host page's identity expired) has no token to
      // fix: their words, in their language; the server's reason is for the site's developers.
      console.warn("chatrun: unauthorized: " + (detail || ""));
      notice.textContent = tx("unauthorized_user");
      notice.dataset.pageText = "unauthorized_user";
      ui.input.placeholder = "";
    } else {
      ui.input.placeholder = "Unauthorized: see the notice above";
      notice.textContent = "Unauthorized: this server needs a token. Open the page with ?token=YOUR_TOKEN at the "
        + "end of its address (tokens are in the server's --auth file)." + (detail ? " The server said: " + detail : "");
    }
    add(notice);
  }

  function setStatus(state, text) {
    ui.status.dataset.state = state;
    ui.status.textContent = text;
    delete ui.status.dataset.key; // a text of its own (an error's): no page text to translate
  }

  // -- chat rendering ---------------------------------------------------------------------

  /** A chat bubble whose direction follows its text (dir="auto"): right-to-left text renders
   * right to left, in the session's language (lang) once the inspector has read it. */
  function chatBubble(cls, text) {
    const node = el("div", cls, text);
    node.dir = "auto";
    if (sessionLocale) node.lang = sessionLocale;
    return node;
  }

  function showUser(text, attachments, replayed) {
    const bubble = chatBubble("msg user");
    bubble.appendChild(el("div", "msg-body", text));
    bubble.dataset.text = text;
    showSentAttachments(bubble, attachments);
    add(bubble);
    announceMessage(bubble, "user", replayed);
  }

  /** Every rendered message gets an action bar (Copy first) and a `chatrun:message` event (the
   * hook at the top: other scripts add their buttons to the bar). */
  function announceMessage(bubble, role, replayed, turn) {
    let actions = bubble.querySelector(":scope > .msg-actions");
    if (!actions) {
      actions = bubble.appendChild(el("div", "msg-actions"));
      actions.appendChild(copyButton(bubble));
    }
    if (!replayed && role !== "user") {
      say(Array.from(bubble.children).filter((c) => c !== actions).map((c) => c.textContent).join(" "));
    }
    bubble.dispatchEvent(new CustomEvent("chatrun:message", {
      bubbles: true,
      detail: { role: role, text: bubble.dataset.text || "", replayed: Boolean(replayed),
        turn: typeof turn === "number" ? turn : null, actions: actions },
    }));
  }

  /** Read out by a screen reader (the #announce region, polite): a new reply or operator message,
   * an error, a card that asks the reader; never the history a load or a reconnect draws again
   * (the chat itself is no live region). A new node each time, so a repeated text is said again. */
  function say(text) {
    const words = String(text || "").trim();
    if (words) ui.announce.replaceChildren(el("p", "", words));
  }

  const COPY_ICON = '<svg viewBox="0 0 24 24" aria-hidden="true" focusable="false"><rect x="8" y="8" width="12" height="12" rx="2" fill="none" stroke="currentColor" stroke-width="2"/><path d="M16 8V6a2 2 0 0 0-2-2H6a2 2 0 0 0-2 2v8a2 2 0 0 0 2 2h2" fill="none" stroke="currentColor" stroke-width="2"/></svg>';

  /** Copy a message's text (its Markdown source for a reply), saying so for a moment. */
  function copyButton(bubble) {
    const button = el("button", "msg-action copy");
    button.type = "button";
    button.innerHTML = COPY_ICON; // a constant: no text of the message goes through innerHTML
    button.dataset.pageLabel = "copy_message";
    button.setAttribute("aria-label", tx("copy_message"));
    button.title = tx("copy_message");
    button.addEventListener("click", () => {
      const done = () => {
        button.classList.add("done");
        button.setAttribute("aria-label", tx("copied"));
        setTimeout(() => { button.classList.remove("done"); button.setAttribute("aria-label", tx("copy_message")); }, 1500);
      };
      if (navigator.clipboard) navigator.clipboard.writeText(bubble.dataset.text || "").then(done, () => undefined);
    });
    return button;
  }

  function turnEvent(name, detail) {
    document.dispatchEvent(new CustomEvent(name, { detail: Object.assign({ chatId: session && session.chatId }, detail) }));
  }

  /** A bot reply: Markdown by markdown.js (marked, then a sanitizer), in the bubble's body. */
  function botBubble(text, cls) {
    const node = chatBubble("msg bot md" + (cls ? " " + cls : ""));
    node.appendChild(el("div", "msg-body"));
    setReply(node, text);
    return node;
  }

  function setReply(bubble, text) {
    bubble.dataset.text = text;
    bubble.querySelector(".msg-body").replaceChildren(ChatrunMarkdown.render(text));
  }

  function showMessage(text, replayed) {
    if (streaming) {
      const bubble = streaming;
      streaming = null;
      showReplying(false);
      bubble.markdown.finish(text);
      bubble.dataset.text = text;
      bubble.classList.remove("streaming");
      scrollDown();
      announceMessage(bubble, "bot", false);
    } else {
      announceMessage(add(botBubble(text)), "bot", replayed);
    }
  }

  /** A streamed chunk: only the reply's last block is rendered again (markdown.js, stream). */
  function showChunk(chunk) {
    if (!streaming) {
      streaming = add(botBubble("", "streaming"));
      streaming.markdown = ChatrunMarkdown.stream(streaming.querySelector(".msg-body"), () => scrollDown());
      showReplying(true);
    }
    // The text is kept by the stream and copied to the bubble when it ends (not on each chunk: an
    // attribute as long as the reply written hundreds of times a second costs its square).
    streaming.markdown.append(chunk);
  }

  /** While a reply streams its cursor shows the bot at work: the dots of the "Thinking…" row
   * under the chat rest (their animation made the browser draw 60 frames a second). */
  function showReplying(on) {
    ui.thinking.classList.toggle("replying", on);
  }

  /** A stream that ended without its Message (an error, a stop): what was shown stays. */
  function endStreaming() {
    if (!streaming) return;
    const bubble = streaming;
    streaming = null;
    showReplying(false);
    bubble.classList.remove("streaming");
    bubble.markdown.finish();
    bubble.dataset.text = bubble.markdown.text();
    announceMessage(bubble, "bot", false);
  }

  function showThinking(text) {
    add(el("div", "note", typeof text === "string" ? text : JSON.stringify(text)));
    ui.thinkingText.textContent = typeof text === "string" ? text : "Thinking…";
  }

  function showError(text, replayed) {
    endStreaming();
    const node = add(el("div", "error", typeof text === "string" ? text : JSON.stringify(text)));
    if (!replayed) say(node.textContent);
  }

  function showConsole(text) {
    console.log("[" + BOT + "]", text);
    add(el("div", "note console", typeof text === "string" ? text : JSON.stringify(text)));
  }

  // -- Object events (and the bot's own types) as readable cards ---------------------------

  /** The JSON Schema describing an Object's data, if the bot declares one: the `output:` schema
   * of the current route, else of a route whose schema has every key of the data. */
  function schemaFor(data) {
    if (!graph || !data || typeof data !== "object" || Array.isArray(data)) return null;
    const keys = Object.keys(data);
    const fits = (s) => s && s.properties && keys.every((k) => k in s.properties);
    const here = graph.nodes.find((n) => n.name === document.body.dataset.route);
    if (here && fits(here.output)) return here.output;
    const other = graph.nodes.find((n) => fits(n.output));
    return other ? other.output : null;
  }

  /** "check_in" and "checkIn" read as "Check in". */
  function humanize(key) {
    const words = String(key).replace(/([a-z])([A-Z])/g, "$1 $2").replace(/[_-]+/g, " ").trim().toLowerCase();
    return words.charAt(0).toUpperCase() + words.slice(1);
  }

  function isPlainObject(value) {
    return value !== null && typeof value === "object" && !Array.isArray(value);
  }

  /** A value as readable nodes: objects as label/value lists (the schema's titles, else the key
   * made readable), lists of plain values joined, other lists one entry each. */
  function valueNode(value, schema) {
    if (isPlainObject(value)) {
      const list = el("dl", "fields");
      for (const key of Object.keys(value)) {
        const sub = schema && schema.properties && schema.properties[key];
        list.appendChild(el("dt", "", (sub && sub.title) || humanize(key)));
        const dd = el("dd");
        dd.appendChild(valueNode(value[key], sub));
        list.appendChild(dd);
      }
      return list;
    }
    if (Array.isArray(value)) {
      if (value.every((v) => !isPlainObject(v) && !Array.isArray(v))) return valueNode(value.map(plainText).join(", "));
      const list = el("ol", "entries");
      for (const v of value) list.appendChild(el("li")).appendChild(valueNode(v, schema && schema.items));
      return list;
    }
    return el("span", value === null || value === undefined ? "none" : "", plainText(value));
  }

  function plainText(value) {
    if (value === null || value === undefined) return "—";
    if (value === true) return "yes";
    if (value === false) return "no";
    return String(value);
  }

  function showObject(data, replayed, type) {
    const schema = schemaFor(data);
    const card = el("div", "object");
    card.dataset.type = type;
    card.appendChild(el("div", "tag", (schema && schema.title) || (type === "Object" ? "Details" : humanize(type))));
    card.appendChild(valueNode(data, schema));
    const raw = el("details", "raw");
    raw.appendChild(el("summary", "", "JSON"));
    const pre = el("pre", "json");
    pre.innerHTML = jsonHtml(data);
    raw.appendChild(pre);
    card.appendChild(raw);
    add(card);
  }

  /** Choices (quick replies) as buttons: a click sends the choice's value; used or replayed ones are disabled. */
  function showChoices(data, replayed) {
    if (choicesOfTheCardAbove(data)) return;
    const box = el("div", "choices");
    for (const choice of (data && data.choices) || []) {
      const button = el("button", "choice", choice.label);
      button.type = "button";
      button.dataset.value = choice.value;
      button.disabled = Boolean(replayed);
      button.addEventListener("click", () => {
        if (busy) return;
        box.querySelectorAll("button").forEach((b) => { b.disabled = true; });
        button.classList.add("picked");
        send(choice.value);
      });
      box.appendChild(button);
    }
    add(box);
  }

  /** The Choices a confirmation comes with (for clients without cards) are its card's own Yes
   * and No: the card just above has those buttons, so the user sees one control, not two. */
  function choicesOfTheCardAbove(data) {
    const card = ui.end.previousElementSibling;
    if (!card || !card.classList.contains("pending-card") || card.dataset.confirm !== "true") return false;
    const values = (choices) => JSON.stringify((choices || []).map((c) => [c.label, c.value]));
    return values(card.item.choices) === values(data && data.choices);
  }

  function showRouteChange(data, quiet) {
    if (!data || !data.stack) return;
    renderBreadcrumb(data.stack);
    if (!quiet) showRouteDivider(data.stack);
    attachmentsFollowRoute(data.stack[data.stack.length - 1]);
  }

  /** What end users read for a route: its `title:`, else (the author's page only) its name. */
  function routeTitle(name) {
    const node = graph && graph.nodes.find((n) => n.name === name);
    return (node && node.title) || (MODE === "user" ? "" : name);
  }

  /** A divider where the conversation moved: the author reads the whole stack ("now in desk ›
   * booking"); a user reads the title of the part they are now in, and nothing for an untitled one. */
  function showRouteDivider(stack) {
    if (MODE === "author") {
      add(el("div", "route-change", tx("now_in", { route: stack.map(routeTitle).join(" › ") })));
      return;
    }
    const title = routeTitle(stack[stack.length - 1]);
    if (title) add(el("div", "route-change", title)).setAttribute("role", "separator");
  }

  function renderBreadcrumb(stack) {
    ui.breadcrumb.textContent = "";
    // The end-user page lists the titled routes only, and no breadcrumb when none has a title.
    if (MODE === "user") stack = stack.filter((route) => routeTitle(route));
    ui.breadcrumb.hidden = stack.length === 0;
    stack.forEach((route, i) => {
      if (i) ui.breadcrumb.appendChild(el("span", "sep", "›"));
      const crumb = el("span", "crumb" + (i === stack.length - 1 ? " current" : ""), routeTitle(route));
      crumb.dataset.route = route;
      ui.breadcrumb.appendChild(crumb);
    });
  }

  /** The conversation has ended (an `end` action): say so, take the input away, offer a new one. */
  function showEnded() {
    endStreaming();
    ended = true;
    ui.input.disabled = true;
    ui.send.disabled = true;
    ui.input.placeholder = tx("ended_placeholder");
    ui.messages.querySelectorAll(".choices button").forEach((b) => { b.disabled = true; });
    attachmentsFollowRoute();
    const notice = el("div", "notice ended");
    notice.id = "ended";
    notice.setAttribute("role", "status");
    notice.appendChild(el("span", "", tx("ended") + " "));
    const again = el("button", "btn primary", tx("start_new"));
    again.type = "button";
    again.id = "start-new";
    again.addEventListener("click", () => reset());
    notice.appendChild(again);
    add(notice);
  }

  function takeInputBack() {
    ended = null;
    ui.input.disabled = false;
    ui.send.disabled = busy;
    ui.input.placeholder = tx("placeholder");
    attachmentsFollowRoute();
  }

  const asText = (data) => (typeof data === "string" ? data : JSON.stringify(data));

  /** One renderer per event type: (data, replayed, type). A type not listed here (an Object,
   * the bot's own types) is shown as a card. A new kind of card is one more line. */
  const RENDERERS = {
    ConversationEnded: () => showEnded(),
    Choices: (data, replayed) => showChoices(data, replayed),
    Message: (data, replayed, type, meta) => showMessageFrom(asText(data), meta || {}, replayed),
    Pending: (data, replayed) => showPending(data, replayed),
    Resolved: (data) => showResolved(data),
    Thinking: (data) => showThinking(data),
    Error: (data, replayed) => showError(data, replayed),
    Console: (data) => showConsole(data),
    RouteChanged: (data) => showRouteChange(data),
    Stream: () => undefined, // the history has the whole Message too
    Sources: (data) => showSources(data),
  };

  /** The knowledge passages a reply cites (docs/knowledge.md): a list of links under it. Only
   * http(s) links are followed; a source without a link shows its title. */
  function showSources(data) {
    const list = el("div", "sources");
    list.appendChild(el("span", "tag", tx("sources")));
    const items = el("ol", "");
    for (const source of (data && data.sources) || []) {
      const item = el("li", "");
      const url = typeof source.url === "string" && /^https?:\/\//i.test(source.url) ? source.url : null;
      const label = source.title || source.ref || "";
      if (url) {
        const link = el("a", "", label);
        link.href = url;
        link.target = "_blank";
        link.rel = "noopener noreferrer";
        item.appendChild(link);
      } else {
        item.appendChild(el("span", "", label));
      }
      item.title = source.ref || "";
      items.appendChild(item);
    }
    list.appendChild(items);
    add(list);
  }

  function showEvent(type, data, replayed, meta) {
    return (RENDERERS[type] || showObject)(data, replayed, type, meta);
  }

  // -- humans in the loop: pending items, decisions, a takeover -----------------------------

  /** A pending item as a card (pending.js): with controls when this user decides it, else a
   * "waiting" card that the Resolved event updates. */
  function showPending(item, replayed) {
    endStreaming();
    const mine = (item.by || []).includes("user");
    const node = ChatrunPending.card(item, { canDecide: mine, decide: (body) => decide(item.id, body) });
    node.classList.add(mine ? "for-user" : "for-others");
    cards.set(item.id, node);
    add(node);
    if (mine && !replayed) say(item.ask); // what it asks; its buttons are found by Tab
  }

  function showResolved(resolved) {
    const node = cards.get(resolved.id);
    if (node) ChatrunPending.resolve(node, resolved);
    if (resolved.kind === "takeover") showTakeover(resolved.outcome === "taken" ? resolved.by : null);
  }

  /** A sentence about an operator in the page's language: `key` with their name, or its
   * `<key>_unnamed` text for one with no name (as the server's page_texts.about_operator). */
  function aboutOperator(key, name) {
    return ChatrunPending.unnamed(name) ? tx(key + "_unnamed") : tx(key, { name: name });
  }

  /** An operator has the conversation: a banner says who; it goes on release. */
  function showTakeover(name) {
    const banner = $("takeover-banner");
    banner.hidden = !name;
    banner.textContent = name ? aboutOperator("talking_to", name) : "";
    banner.dataset.name = name || "";
    if (!name) showOperatorTyping(null);
  }

  /** A Message by whom its `meta.from` says: the bot, an operator, or chatrun itself (a notice). */
  function showMessageFrom(text, meta, replayed) {
    if (meta.from === "operator") return showOperatorMessage(text, meta.name, replayed);
    if (meta.from === "notice") return showNoticeLine(text, meta);
    return showMessage(text, replayed);
  }

  /** "olga joined / left the conversation": a divider line in the session's language (the
   * engine's text, or the bot's `page.operator_joined`), not a reply of the bot. */
  function showNoticeLine(text, meta) {
    endStreaming();
    const line = chatBubble("notice-line", text);
    line.dataset.notice = meta.notice || "";
    add(line);
    if (meta.notice === "operator_left") showOperatorTyping(null);
  }

  function showOperatorMessage(text, name, replayed) {
    endStreaming();
    const bubble = botBubble(text, "operator");
    const from = ChatrunPending.unnamed(name) ? tx("operator_unnamed") : tx("op_from", { name: name });
    bubble.insertBefore(el("div", "from", from), bubble.firstChild);
    add(bubble);
    announceMessage(bubble, "operator", replayed);
  }

  /** The user's own decision or answer: a turn over HTTP, its events shown as they come back. */
  async function decide(item, body) {
    if (busy) throw new Error("Wait for the current reply first.");
    setBusy(true);
    epoch += 1;
    let ok = false;
    turnEvent("chatrun:turn-start", {});
    try {
      const reply = await api("/sessions/" + encodeURIComponent(session.chatId) + "/pending/" + encodeURIComponent(item), {
        method: "POST", body: JSON.stringify(body),
        headers: { "Content-Type": "application/json", "Idempotency-Key": "page-" + item + "-" + Date.now() },
      });
      seenTurns.add(reply.turn);
      for (const event of reply.events || []) {
        if (!event.audience || event.audience === "user") showEvent(event.type, event.data, false, event.meta);
      }
      ok = true;
    } finally {
      turnEvent("chatrun:turn-end", { ok: ok });
      epoch += 1;
      setBusy(false);
      refreshInspector();
      watch();
    }
  }

  /** While an item waits for someone else, or an operator has the conversation, read the
   * session every 1.5 s and show the turns others made (their decisions, operator messages). */
  async function watch() {
    if (!session) return;
    const started = epoch;
    let data;
    try {
      data = await api("/sessions/" + encodeURIComponent(session.chatId));
    } catch (err) {
      data = null;
    }
    if (data && started === epoch && !busy) showOthersTurns(data);
    // The operator's typing rides on the same poll, only while they hold the conversation.
    const typing = data && data.taken_over ? await api("/sessions/" + encodeURIComponent(session.chatId) + "/typing").catch(() => null) : null;
    showOperatorTyping(typing && typing.operator);
    // A failed read (the server restarting) is tried again, more slowly, only while waiting.
    if (data) waitingOnOthers = Boolean((data.pending || []).some((i) => !(i.by || []).includes("user")) || data.taken_over);
    clearTimeout(watching);
    watching = waitingOnOthers ? setTimeout(watch, data ? 1500 : 5000) : null;
  }

  function showOthersTurns(data) {
    let shown = false;
    for (const entry of data.history || []) {
      if (seenTurns.has(entry.turn)) continue;
      seenTurns.add(entry.turn);
      const input = entry.input;
      if (typeof input === "string" || (input && input.userMessage !== undefined)) continue; // this page's own
      for (const event of entry.events || []) {
        if (!event.audience || event.audience === "user") showEvent(event.type, event.data, false, event.meta);
      }
      shown = true;
    }
    showTakeover(data.taken_over ? ChatrunPending.holder(data.taken_over) : null);
    if (shown) refreshInspector();
  }

  // -- typing, both ways, while an operator holds the conversation (docs/operators.md) -------------

  /** "olga is typing…" where "Thinking…" shows, while the operator types (null: nobody). */
  function showOperatorTyping(name) {
    const line = $("operator-typing");
    const text = name ? aboutOperator("operator_typing", name) : "";
    if (line.textContent !== text) line.textContent = text;
    line.hidden = !name;
  }

  const TYPING_PING = 3000; // ms between two "typing" pings (the server counts one for 6 s)
  let lastTypingPing = 0;

  /** The user's own typing, told to the operator who holds the conversation (nobody else reads it). */
  function pingTyping(on) {
    if (!session || !$("takeover-banner").dataset.name) return;
    const now = Date.now();
    if (on ? now - lastTypingPing < TYPING_PING : !lastTypingPing) return;
    lastTypingPing = on ? now : 0;
    api("/sessions/" + encodeURIComponent(session.chatId) + "/typing", {
      method: "POST", body: JSON.stringify({ typing: on }), headers: { "Content-Type": "application/json" },
    }).catch(() => undefined); // a lost ping is harmless: the next one tells
  }

  function setBusy(on) {
    busy = on;
    ui.send.disabled = on || Boolean(ended);
    ui.thinking.hidden = !on;
    if (on) ui.thinkingText.textContent = tx("thinking");
  }

  // -- session --------------------------------------------------------------------------------

  function wsUrl() {
    const proto = location.protocol === "https:" ? "wss:" : "ws:";
    let url = proto + "//" + location.host + "/bots/" + encodeURIComponent(BOT) + "/_chat/routes";
    if (TOKEN) url += "?token=" + encodeURIComponent(TOKEN);
    return url;
  }

  // The locale a new session asks for (docs/i18n.md): ?locale=de, else the browser's languages.
  const LOCALE = params.get("locale") || (navigator.languages || [navigator.language]).filter(Boolean).join(", ");

  function builder() {
    return client.builder()
      .locale(LOCALE)
      // Stream frames at a reader's pace (engine/stream_chunks.py READER): four a second, fewer for a
      // reply faster than anyone reads; each costs the page to receive, and each is drawn (markdown.js).
      .streamEvery("reader")
      .messageHandler((data) => showMessage(asText(data)))
      .streamHandler(showChunk)
      .thinkingHandler(showThinking)
      .errorHandler(showError)
      .consoleHandler(showConsole)
      .routeChangedHandler((d) => showRouteChange(d))
      .eventHandler("ModelRequest", askTheAuthor)  // the author plays the model (sent to the author's page only)
      .defaultHandler((type, data) => showEvent(type, data));  // Choices, Object and custom types
  }

  async function startSession() {
    const saved = localStorage.getItem(STORE_KEY);
    if (saved) {
      try {
        session = await builder().resume(saved).connect();
        await replayHistory();
        return;
      } catch (err) {
        localStorage.removeItem(STORE_KEY); // gone (deleted, or another principal's): start afresh
      }
    }
    session = await builder().connect();
    localStorage.setItem(STORE_KEY, session.chatId);
    clearMessages();
    showEmpty();
  }

  /** The empty chat's greeting: the bot's name for its author, a plain invitation for its users. */
  function showEmpty() {
    const empty = el("div", "empty", MODE === "user" ? tx("hello_user") : tx("hello", { bot: BOT }));
    if (MODE === "user") empty.dataset.pageText = "hello_user"; // follows the session's locale
    ui.messages.insertBefore(empty, ui.end);
  }

  async function replayHistory() {
    clearMessages();
    const data = await api("/sessions/" + encodeURIComponent(session.chatId));
    for (const entry of data.history || []) {
      const input = entry.input;
      const text = typeof input === "string" ? input : input && input.userMessage;
      const files = (input && input.attachments) || [];
      if (text || files.length) showUser(text || "", files, true);
      // The server lists the user's events only (an operator's token also gets operators events,
      // which are not for this chat either).
      const events = (entry.events || []).filter((e) => !e.audience || e.audience === "user");
      for (const event of events) showEvent(event.type, event.data, true, event.meta);
      seenTurns.add(entry.turn);
      // A failed turn's history has its error apart from the events it got to send.
      if (entry.ok === false && entry.error && !events.some((e) => e.type === "Error")) showError(entry.error, true);
    }
    renderBreadcrumb(data.stack);
    showTakeover(data.taken_over ? ChatrunPending.holder(data.taken_over) : null);
    watch();
    if (!(data.history || []).length) showEmpty();
    return data;
  }

  /** After a reconnect, the turn whose connection closed before its end: the chat is drawn again
   * from the server's history, so its reply shows once if the server committed it (as a failed
   * turn's error if it failed); if the server has no record of it, its text goes back to the box. */
  async function recoverLostTurn(lost) {
    const data = await replayHistory();
    const own = (entry) => entry.turn > lost.turn && ((entry.input && entry.input.userMessage) || entry.input) === lost.text;
    if (!(data.history || []).some(own)) return giveBack(lost);
    // Its reply (or error) was drawn with the history, which is not read out: it is, as it would have been.
    const last = Array.from(ui.messages.querySelectorAll(":scope > .msg.bot, :scope > .error")).pop();
    if (last) say(last.classList.contains("error") ? last.textContent : last.querySelector(".msg-body").textContent);
  }

  /** A message the server has no record of (or whose fate could not be read), or whose turn
   * failed (rolled back, `failed_turn`): back in the box, its files back in the tray (unless the
   * reader has put others there meanwhile), told with the page text `note`. */
  function giveBack(lost, note) {
    if (!ui.input.value) ui.input.value = lost.text;
    if (!tray.length && lost.files.length) {
      tray.push(...lost.files);
      renderTray();
    }
    showError(tx(note || "lost_turn"));
  }

  /** Whether the page takes a message now: one turn at a time, none once the conversation ended,
   * none while it reconnects (the session of a closed connection would drop it unsaid). */
  function accepting() {
    return !busy && !ended && Boolean(session) && session.client === client && connected();
  }

  function connected() {
    return Boolean(client && client.websocket) && client.websocket.readyState === WebSocket.OPEN;
  }

  async function send(text) {
    if ((!text.trim() && !tray.length) || !accepting()) return;
    setBusy(true);
    epoch += 1;
    let files;
    try {
      files = await uploadTray();
    } catch (err) { // refused (a limit, no blob area): nothing is sent, the message stays to edit
      // The server names the session first (for logs); the user needs only the reason.
      showAttachProblem(tx("not_sent", { reason: String(err.message || err).replace(/^session \S+: /, "") }));
      if (!ui.input.value) ui.input.value = text;
      epoch += 1;
      setBusy(false);
      return;
    }
    const sentTray = tray.slice(); // given back if the turn is lost or fails
    clearTray(true);
    showAttachProblem("");
    showUser(text, files);
    scrollDown(true); // the reader's own message: back to the bottom
    let ok = false;
    turnEvent("chatrun:turn-start", {});
    session.playModel = playMode();
    try {
      await (files.length ? session.sendData({ userMessage: text, attachments: files }) : session.chat(text));
      ok = true;
    } catch (err) {
      // The connection closed mid-turn: what became of it is read once the page is back (reconnect).
      if (err.reason === "Closed") lostTurn = { text: text, files: sentTray, turn: inspectData ? inspectData.turn : 0 };
      else {
        // The Error frame before a Failed was shown by the errorHandler; else show the reason.
        if (!err.detail) showError(err.message || String(err));
        // A failed turn is rolled back: its text and files come back to send again (a stopped
        // one, Cancelled, is the reader's own doing: what they wrote stays in the chat only).
        // Not when tools with an outside effect ran (`ran`): sending it again would repeat them;
        // the Error shown says which ran and asks the reader to check what they did.
        if (err.ran && err.ran.length) showError(tx("failed_kept_out", { tools: err.ran.join(", ") }));
        else if (err.reason !== "Cancelled") giveBack({ text: text, files: sentTray }, "failed_turn");
      }
    } finally {
      endStreaming();
      closePlay();
      turnEvent("chatrun:turn-end", { ok: ok });
      epoch += 1;
      setBusy(false);
      refreshInspector();
      watch();
      // Back to the box for the next message, unless the reader selected text in the chat
      // (focusing the box would take their selection away).
      if (getSelection().isCollapsed) ui.input.focus();
    }
  }

  async function reset() {
    if (busy) return;
    clearMessages();
    clearTray();
    showAttachProblem("");
    cards.clear();
    seenTurns.clear();
    clearTimeout(watching);
    waitingOnOthers = false;
    showTakeover(null);
    // No input until the new session is connected: a message typed meanwhile would go to the
    // old (ended, closing) session, or nowhere.
    const old = session;
    session = null;
    if (old) {
      try { await old.close(); } catch (err) { /* already gone */ }
    }
    localStorage.removeItem(STORE_KEY);
    await startSession();
    takeInputBack();
    renderBreadcrumb([graph ? graph.default : ""]);
    refreshInspector();
  }

  // -- playing the model (author's page; docs/authoring.md, "Playing the model") ----------------

  let playing = null; // the ModelRequest waiting for the author's answer

  /** What this page asks of each turn: the author plays the model when none can answer ("auto"),
   * or on every call when "Play model" is ticked; the end-user page never plays. */
  function playMode() {
    if (MODE !== "author") return null;
    return $("play-always").checked ? "always" : "auto";
  }

  function askTheAuthor(data) {
    endStreaming();
    playing = data;
    const form = $("play-model");
    const where = $("play-where");
    where.textContent = "route " + data.route + (data.why ? " \u00b7 no model can be reached" : " \u00b7 you play it");
    where.title = data.why || "";
    renderSees(data);
    const select = $("play-tool");
    select.textContent = "";
    (data.tools || []).forEach((t) => {
      const option = el("option", "", t.name);
      option.value = t.name;
      option.title = t.description || "";
      select.appendChild(option);
    });
    $("play-kind-tool").disabled = !(data.tools || []).length;
    $("play-text").value = "";
    $("play-args").value = argumentsSkeleton(data.tools && data.tools[0]);
    setPlayKind("text");
    showPlayProblem("");
    ui.thinking.hidden = true;
    form.hidden = false;
    $("play-text").focus();
    scrollDown(true);
  }

  function renderSees(data) {
    const box = $("play-sees");
    box.textContent = "";
    const line = (who, text) => {
      const row = el("div", "seen");
      row.appendChild(el("b", "", who + ": "));
      row.appendChild(document.createTextNode(text));
      box.appendChild(row);
    };
    if (data.system) line("system", data.system);
    if (data.omitted) line("…", data.omitted + " earlier messages");
    (data.messages || []).forEach((m) => {
      const calls = (m.tool_calls || []).map((c) => c.name + " " + c.arguments).join("; ");
      const who = m.role === "tool" ? "tool " + (m.name || "") : m.role;
      line(who, [m.content || "", calls ? "calls " + calls : ""].filter(Boolean).join(" "));
    });
    if ((data.tools || []).length) line("tools", data.tools.map((t) => t.name).join(", "));
  }

  /** {"param": ""} for each required parameter of a tool: a start for its JSON arguments. */
  function argumentsSkeleton(tool) {
    const params = (tool && tool.parameters) || {};
    const out = {};
    (params.required || []).forEach((name) => { out[name] = ""; });
    return JSON.stringify(out);
  }

  function setPlayKind(kind) {
    document.querySelectorAll('input[name="play-kind"]').forEach((r) => { r.checked = r.value === kind; });
    $("play-call").hidden = kind !== "tool";
    $("play-text").hidden = kind !== "text";
  }

  function showPlayProblem(text) {
    $("play-problem").hidden = !text;
    $("play-problem").textContent = text;
  }

  function closePlay() {
    playing = null;
    $("play-model").hidden = true;
  }

  async function answerAsModel() {
    if (!playing || !session) return;
    const kind = document.querySelector('input[name="play-kind"]:checked').value;
    let answer;
    if (kind === "tool") {
      try {
        answer = { tool: $("play-tool").value, arguments: JSON.parse($("play-args").value || "{}") };
      } catch (err) {
        showPlayProblem("The arguments are not JSON: " + err.message);
        return;
      }
    } else {
      const text = $("play-text").value.trim();
      if (!text) { showPlayProblem("Type the model's reply (or call a tool)."); return; }
      answer = { text: text };
    }
    const ask = playing.ask;
    try {
      await session.answerModel(ask, answer);
    } catch (err) {
      showPlayProblem(err.detail || err.message || String(err));
      return;
    }
    if (playing && playing.ask === ask) closePlay();
    ui.thinking.hidden = !busy;
  }

  function setUpPlay() {
    if (MODE !== "author") return;
    $("play-model").addEventListener("submit", (ev) => { ev.preventDefault(); answerAsModel(); });
    document.querySelectorAll('input[name="play-kind"]').forEach((r) => {
      r.addEventListener("change", () => setPlayKind(r.value));
    });
    $("play-tool").addEventListener("change", () => {
      const tool = (playing && playing.tools || []).find((t) => t.name === $("play-tool").value);
      $("play-args").value = argumentsSkeleton(tool);
    });
    $("play-text").addEventListener("keydown", (ev) => {
      if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); $("play-model").requestSubmit(); }
    });
    const KEY = "chatrun:play-model";
    $("play-always").checked = localStorage.getItem(KEY) === "always";
    $("play-always").addEventListener("change", () => {
      localStorage.setItem(KEY, $("play-always").checked ? "always" : "auto");
    });
  }

  // -- inspector ----------------------------------------------------------------------------

  async function refreshInspector() {
    if (!session) return;
    try {
      inspectData = await api("/sessions/" + encodeURIComponent(session.chatId) + "/inspect");
    } catch (err) {
      return;
    }
    const d = inspectData;
    graph = d.graph;
    // Completed turns: a failed attempt (shown under "Last turn") does not count.
    $("session-id").textContent = "session " + d.id + " · " + plural(d.turn, "completed turn");
    $("route-now").textContent = "· on " + d.route;
    // The version of the bot the session runs: its human name and content hash (docs/versions.md).
    $("bot-version").textContent = d.botVersionLabel ? "· version " + d.botVersionLabel : "";
    document.body.dataset.botVersion = d.botVersion || "";
    // The locale the session speaks (docs/i18n.md), for a bot with `locales:`.
    sessionLocale = d.locale || "";
    showInLocale(d);
    $("session-locale").textContent = d.locale ? "· locale " + d.locale : "";
    renderBreadcrumb(d.stack);
    // The route graph is the inspector's, which end users do not have: laying out its edge labels
    // costs a turn's end some 40-120 ms of main-thread time on a slow machine.
    if (MODE === "author") drawGraph(d.graph, d.stack);
    renderScopes(d.scopes, d.scopeId);
    attachmentsFollowRoute(d.route);
    $("state").innerHTML = jsonHtml(d.state);
    renderMemory(d.memory);
    renderLastTurn(d.last_turn);
    renderUsage(d.usage, d.turns_usage || [], d.last_turn);
    renderReloadProblems(d.reload_problems || []);
    renderModelProblem(d.model_problem);
    document.body.dataset.route = d.route;
    document.body.dataset.turn = String(d.turn);
    refreshes += 1;
    document.body.dataset.refreshes = String(refreshes);
  }

  // serve --reload: the bot's files were edited into an invalid bot; the old one still runs.
  function renderReloadProblems(problems) {
    const banner = $("reload-banner");
    banner.hidden = problems.length === 0;
    banner.textContent = "";
    if (!problems.length) return;
    banner.appendChild(el("strong", "", "The edited bot is invalid; still running the previous version."));
    problems.forEach((d) => {
      banner.appendChild(el("div", "small", d.file + ":" + d.line + ": " + d.severity + ": " + d.message));
    });
  }

  /** No model can be reached (no credentials, no endpoint): say why above the chat, not only
   * "Sorry…" after each message. Its users read that the chat cannot answer yet and what to do;
   * its author reads the cause and how to walk the bot without a model. */
  function renderModelProblem(problem) {
    const banner = $("model-banner");
    banner.hidden = !problem;
    banner.textContent = "";
    document.body.classList.toggle("no-model", Boolean(problem));
    if (!problem) return;
    if (MODE === "user") {
      banner.appendChild(el("span", "", tx("no_model_user")));
      return;
    }
    banner.appendChild(el("strong", "", tx("no_model") + " "));
    banner.appendChild(el("span", "", problem + " "));
    banner.appendChild(el("div", "", "Answer in its place: send a message, and each time the bot calls the model "
      + "this page asks you for the model\u2019s answer (a reply, or a tool call). Your users see a plain "
      + "\u201ccannot answer yet\u201d instead (/chat/" + BOT + ")."));
  }

  function renderScopes(scopes, current) {
    const box = $("scopes");
    box.textContent = "";
    let parent = box;
    scopes.forEach((scope) => {
      const card = el("div", "scope" + (scope.id === current ? " current" : ""));
      card.dataset.scope = scope.id;
      const head = el("div", "scope-head");
      head.appendChild(el("span", "", scope.route));
      head.appendChild(el("span", "scope-id", scope.id));
      card.appendChild(head);
      const pre = el("pre", "json");
      pre.innerHTML = jsonHtml(scope.visible);
      card.appendChild(pre);
      const owned = [];
      if (Object.keys(scope.local || {}).length) owned.push("local: " + Object.keys(scope.local).join(", "));
      if (Object.keys(scope.shared || {}).length) owned.push("shared: " + Object.keys(scope.shared).join(", "));
      if (owned.length) card.appendChild(el("div", "muted small", owned.join(" · ")));
      parent.appendChild(card);
      const nest = el("div", "scope-indent");
      parent.appendChild(nest);
      parent = nest;
    });
  }

  function renderMemory(memory) {
    const box = $("memory");
    box.textContent = "";
    const policy = memory.policy || {};
    const size = policy.type === "message_window" ? " (" + policy.max_messages + " messages)"
      : policy.type === "token_window" ? " (" + policy.max_tokens + " tokens)"
      : policy.type === "summary" ? " (over " + policy.max_tokens + " tokens, newest " + policy.keep_messages + " kept)" : "";
    const clearing = typeof policy.clear_tool_results === "number"
      ? " · tool results older than the newest " + policy.clear_tool_results + " cleared" : "";
    const total = memory.tokens ? " · " + tokens(memory.tokens.total)
      + (memory.tokens.max_tokens ? " of " + tokens(memory.tokens.max_tokens) : "") + " tokens, " + memory.tokens.counter : "";
    $("memory-meta").textContent = "· " + plural(memory.messages.length, "message") + total + " · " + policy.type + size
      + clearing + " · " + memory.model;
    if (!memory.messages.length) box.appendChild(el("div", "muted", "empty: this route has not run in this scope yet"));
    const counts = (memory.tokens && memory.tokens.messages) || [];
    memory.messages.forEach((m, i) => {
      // Drawn by CSS from the attribute: the count is not part of the message's text.
      const counted = typeof counts[i] === "number" ? plural(counts[i], "token") : null;
      if (typeof m.summary === "string") {
        box.appendChild(renderSummary(m, counted));
        return;
      }
      const item = el("div", "mem " + m.role + (m.context ? " context" : ""));
      if (counted) item.dataset.tokens = counted;
      item.appendChild(el("div", "role", m.role + (m.name ? " · " + m.name : "") + (m.tool_call_id ? " · " + m.tool_call_id : "") +
        (m.context ? " · context (rendered for each call, never kept)" : "")));
      if (m.content) item.appendChild(el("div", "content", memoryText(m.content)));
      for (const call of m.tool_calls || []) {
        const f = call.function || call;
        item.appendChild(el("div", "call", "→ " + f.name + "(" + f.arguments + ")"));
      }
      box.appendChild(item);
    });
    $("tools").innerHTML = jsonHtml(memory.tools.map((t) => t.function || t));
  }

  /** A `summary` memory's running summary: what the folded messages became (sent to the
   * model as a user message under a heading, so it is labelled, not shown as the user's). */
  function renderSummary(m, counted) {
    const item = el("div", "mem summary");
    if (counted) item.dataset.tokens = counted;
    item.appendChild(el("div", "role", "summary of earlier messages · sent as " + m.role));
    item.appendChild(el("div", "content", m.summary));
    return item;
  }

  // -- usage: what the model calls cost ------------------------------------------------------

  function tokens(n) { return (n || 0).toLocaleString("en-US"); }

  /** Money in the units of the bot's prices, as the CLI writes it (cli/_usage.py cost_text):
   * four significant digits below 1, four decimals above, no exponent. */
  function money(cost) {
    if (!cost) return "0";
    const text = cost >= 1 ? cost.toFixed(4) : Number(cost.toPrecision(4)).toFixed(12);
    return text.replace(/0+$/, "").replace(/\.$/, "");
  }

  function usageCells(u) {
    return [
      tokens(u.input_tokens) + (u.cached_input_tokens ? " (" + tokens(u.cached_input_tokens) + " cached)" : ""),
      tokens(u.output_tokens) + (u.reasoning_tokens ? " (" + tokens(u.reasoning_tokens) + " reasoning)" : ""),
      u.cost === null || u.cost === undefined ? "–" : money(u.cost),
    ];
  }

  function usageRow(label, u, cls) {
    const row = el("tr", cls || "");
    row.appendChild(el("td", "", label));
    usageCells(u).forEach((text) => row.appendChild(el("td", "num", text)));
    const mark = el("td", "");
    if (u.estimated) mark.appendChild(el("span", "estimated", "estimated"));
    row.appendChild(mark);
    return row;
  }

  function usageTable(caption, rows) {
    const table = el("table", "usage-table");
    table.appendChild(el("caption", "", caption));
    const head = el("tr", "");
    ["", "input", "output", "cost", ""].forEach((text) => head.appendChild(el("th", "", text)));
    table.appendChild(head);
    rows.forEach((row) => table.appendChild(row));
    return table;
  }

  /** The session's total, then each turn's, then each call of the last turn. Counts chatrun
   * made itself (the endpoint reported none) are marked estimated; cost shows with prices:. */
  function renderUsage(total, turns, last) {
    const box = $("usage");
    box.textContent = "";
    if (!total) return;
    const priced = total.cost !== null && total.cost !== undefined;
    $("usage-meta").textContent = "· " + plural(total.calls, "model call") + " · "
      + tokens(total.input_tokens + total.output_tokens) + " tokens" + (priced ? " · cost " + money(total.cost) : "")
      + (total.estimated ? " · estimated" : "");
    box.appendChild(usageTable("session", [usageRow("total", total, "session-total")]));
    const counted = turns.filter((t) => t.usage);
    if (counted.length) {
      box.appendChild(usageTable("per turn", counted.map((t) =>
        usageRow("turn " + t.turn + (t.ok ? "" : " (failed)"), t.usage, "turn-usage"))));
    }
    const calls = (last && last.usage && last.usage.by_call) || [];
    if (calls.length) {
      box.appendChild(usageTable("turn " + last.turn + ", each model call", calls.map((c) =>
        usageRow(c.route + " · " + c.model, c, "call-usage"))));
    }
    if (!priced && total.calls) box.appendChild(el("div", "muted small", "no cost: the bot declares no prices: for these models"));
  }

  /** The last turn as the history recorded it: input, outcome, and every event in order. */
  function renderLastTurn(entry) {
    const box = $("last-turn");
    box.textContent = "";
    if (!entry) {
      $("turn-meta").textContent = "";
      box.appendChild(el("div", "muted", "no turn yet"));
      return;
    }
    $("turn-meta").textContent = "· turn " + entry.turn + (entry.ok ? " · ok" : " · failed, rolled back");
    const input = el("pre", "json");
    input.innerHTML = jsonHtml({ input: entry.input });
    box.appendChild(input);
    if (!entry.ok && entry.error) box.appendChild(el("div", "error", entry.error));
    for (const s of entry.summaries || []) {  // a `summary` memory folded messages after the reply
      box.appendChild(el("div", "muted small summary-note", s.failed
        ? "summarizing memory " + s.memory + " failed (the next turn retries): " + s.failed
        : "memory " + s.memory + ": " + plural(s.folded, "message") + " folded into its summary"));
    }
    for (const event of entry.events || []) {
      // Every audience's events are here (the author's view); only the user's reached the chat.
      const audience = event.audience || "user";
      const row = el("div", "turn-event" + (audience === "user" ? "" : " not-for-user"));
      row.dataset.audience = audience;
      const kind = el("span", "event-type", event.type);
      if (audience !== "user") kind.appendChild(el("span", "audience", audience));
      row.appendChild(kind);
      row.appendChild(el("span", "", typeof event.data === "string" ? event.data : JSON.stringify(event.data)));
      box.appendChild(row);
    }
  }

  /** The route graph in plain SVG: routes in rows by push depth from the default route. */
  function drawGraph(g, stack) {
    const box = $("graph");
    const current = stack[stack.length - 1];
    const onStack = new Set(stack);
    const moves = g.edges.filter((e) => e.to);
    const level = {};
    level[g.default] = 0;
    const queue = [g.default];
    while (queue.length) {
      const from = queue.shift();
      for (const e of moves) {
        if (e.from === from && level[e.to] === undefined) {
          level[e.to] = level[from] + (e.kind === "push" ? 1 : 0);
          queue.push(e.to);
        }
      }
    }
    const maxLevel = Math.max(0, ...Object.values(level));
    for (const n of g.nodes) if (level[n.name] === undefined) level[n.name] = maxLevel + 1;
    const rows = [];
    for (const n of g.nodes) (rows[level[n.name]] = rows[level[n.name]] || []).push(n);
    // Route changes between routes of the first row arc above it (below it, they would cross
    // the push labels); elsewhere below their row. Each further arc on a side runs wider, so
    // labels never sit on one another.
    const sameRowTop = moves.filter((e) => e.kind !== "push" && level[e.from] === 0 && level[e.to] === 0 && e.from !== e.to);
    const arcsAbove = rows.length > 1 ? new Set(sameRowTop.map((e) => e.from + ">" + e.to)).size : 0;
    const W = 430, rowH = 112, nodeH = 32, arcStep = 18, top = 14 + (arcsAbove ? 30 + arcStep * arcsAbove : 0);
    const arcs = {}; // side -> arcs drawn so far
    const pos = {};
    rows.forEach((row, r) => {
      if (!row) return;
      const nodeW = Math.min(124, W / (row.length + 1) - 14);
      row.forEach((n, i) => {
        const cx = (W / (row.length + 1)) * (i + 1);
        pos[n.name] = { x: cx - nodeW / 2, y: top + r * rowH, w: nodeW, h: nodeH, cx: cx };
      });
    });
    const arcsBelow = new Set(moves.filter((e) => e.kind !== "push" && level[e.from] === level[e.to] && e.from !== e.to
      && !(arcsAbove && level[e.from] === 0)).map((e) => e.from + ">" + e.to)).size;
    const H = top + rows.length * rowH - rowH + nodeH + 40 + arcStep * Math.max(1, arcsBelow); // room below for same-row route changes
    const root = svg("svg", { viewBox: "0 0 " + W + " " + H, role: "img", "aria-label": "route graph" });
    const defs = svg("defs", {});
    const marker = svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: "9", refY: "5", markerWidth: "7", markerHeight: "7", orient: "auto-start-reverse" });
    marker.appendChild(svg("path", { d: "M0,0 L10,5 L0,10 z", fill: "#9aa3b5" }));
    defs.appendChild(marker);
    root.appendChild(defs);
    // The SVG is measured while drawn (labels' widths, points along edges): in the page, hidden.
    box.textContent = "";
    box.appendChild(root);
    // Pops go back to every route that pushes here.
    const parents = {};
    for (const e of moves) if (e.kind === "push") (parents[e.to] = parents[e.to] || new Set()).add(e.from);
    const drawn = new Set();
    const lines = [];
    for (const e of g.edges) {
      const targets = e.to ? [e.to] : Array.from(parents[e.from] || []);
      for (const to of targets) {
        const key = e.from + ">" + to + ":" + e.kind;
        if (drawn.has(key) || !pos[e.from] || !pos[to]) continue;
        drawn.add(key);
        lines.push({ from: e.from, to: to, kind: e.kind, tools: g.edges.filter((x) => x.from === e.from && x.kind === e.kind && (x.to || to) === to).map((x) => (x.condition ? x.tool + " [" + x.condition + "]" : x.tool)) });
      }
    }
    // Edges down to the next rows leave a route from their own point of its bottom, in the order
    // of their targets, so they fan out instead of crossing; a pop comes back beside its push.
    const down = {};
    for (const line of lines) {
      if (line.kind !== "pop" && pos[line.to].y > pos[line.from].y) (down[line.from] = down[line.from] || []).push(line.to);
    }
    for (const from in down) down[from] = Array.from(new Set(down[from])).sort((x, y) => pos[x].cx - pos[y].cx);
    const port = (from, to) => {
      const kids = down[from] || [], i = kids.indexOf(to), a = pos[from];
      return i < 0 ? a.cx : a.x + (a.w * (i + 1)) / (kids.length + 1);
    };
    const curve = (x1, y1, x2, y2, bend) => "M" + x1 + "," + y1 + " C" + x1 + "," + (y1 + bend) + " " + x2 + "," + (y2 - bend) + " " + x2 + "," + y2;
    const paths = [];
    for (const line of lines) {
      const a = pos[line.from], b = pos[line.to];
      let d;
      if (line.kind === "pop" && b.y < a.y) {
        d = curve(a.cx + 5, a.y, port(line.to, line.from) + 5, b.y + b.h, -36);
      } else if (line.kind === "pop") {
        const x1 = a.cx + a.w / 4, y1 = a.y, x2 = b.cx + b.w / 4, y2 = b.y + b.h;
        d = "M" + x1 + "," + y1 + " C" + (x1 + 30) + "," + (y1 - 30) + " " + (x2 + 30) + "," + (y2 + 30) + " " + x2 + "," + y2;
      } else if (b.y > a.y) {
        d = curve(port(line.from, line.to), a.y + a.h, b.cx - 5, b.y, 36);
      } else {
        const above = arcsAbove > 0 && level[line.from] === 0;
        const side = above ? "above" : "below:" + level[line.from];
        const depth = 34 + arcStep * (arcs[side] = (arcs[side] || 0) + 1) - arcStep;
        const sign = above ? -1 : 1;
        const x1 = a.cx, y1 = above ? a.y : a.y + a.h, x2 = b.cx, y2 = above ? b.y : b.y + b.h;
        d = "M" + x1 + "," + y1 + " C" + x1 + "," + (y1 + sign * depth) + " " + x2 + "," + (y2 + sign * depth) + " " + x2 + "," + y2;
      }
      const path = svg("path", { d: d, class: "edge " + line.kind, "marker-end": "url(#arrow)" });
      path.appendChild(svg("title", {}, line.kind + " via " + line.tools.join(", ")));
      root.appendChild(path);
      paths.push({ path: path, line: line });
    }
    placeEdgeLabels(root, paths, Object.values(pos), W, H);
    for (const n of g.nodes) {
      const p = pos[n.name];
      const cls = ["node"];
      if (onStack.has(n.name)) cls.push("on-stack");
      if (n.name === current) cls.push("current");
      if (n.name === selectedRoute) cls.push("selected");
      const group = svg("g", { class: cls.join(" "), "data-route": n.name, tabindex: "0" });
      group.appendChild(svg("rect", { x: p.x, y: p.y, width: p.w, height: p.h, rx: 8 }));
      const label = (n.default ? "★ " : "") + n.name;
      const maxChars = Math.max(4, Math.floor(p.w / 7));
      const short = (t) => (t.length > maxChars ? t.slice(0, maxChars - 1) + "…" : t);
      if (n.roles.length) {
        group.appendChild(svg("text", { x: p.cx, y: p.y + p.h / 2 - 2, "text-anchor": "middle" }, short(label)));
        group.appendChild(svg("text", { x: p.cx, y: p.y + p.h / 2 + 10, "text-anchor": "middle", class: "roles" }, short("roles: " + n.roles.join(", "))));
      } else {
        group.appendChild(svg("text", { x: p.cx, y: p.y + p.h / 2 + 4, "text-anchor": "middle" }, short(label)));
      }
      group.appendChild(svg("title", {}, n.name + (n.description ? ": " + n.description : "")));
      group.addEventListener("click", () => { selectedRoute = n.name; drawGraph(g, stack); showRouteDetail(n); });
      root.appendChild(group);
    }
    root.appendChild(svg("text", { x: 4, y: H - 6, class: "legend" }, "solid: push · dashed: route · dotted: pop · ★ default route"));
    const sel = g.nodes.find((n) => n.name === selectedRoute);
    if (sel) showRouteDetail(sel);
  }

  /** Each edge's label beside its edge: the first spot along it (middle first, either side)
   * that overlaps no other label, no route and no edge; failing that, the least crowded. */
  function placeEdgeLabels(root, paths, nodes, W, H) {
    const placed = [];
    const points = paths.map((p) => pointsAlong(p.path, 3)).flat();
    for (const { path, line } of paths) {
      if (line.kind === "pop") continue; // pops go back along the pushes; their tools show on hover
      const text = line.tools.length > 1 ? line.tools[0] + " +" + (line.tools.length - 1) : line.tools[0];
      const label = svg("text", { x: 0, y: 0, class: "edge-label", "text-anchor": "start" }, text);
      root.appendChild(label);
      const size = label.getBBox(); // 0 while the inspector is hidden: an estimate, redrawn when shown
      const w = size.width || text.length * 5.6, h = size.height || 13, above = size.height ? -size.y : 10;
      let best = null;
      for (const spot of labelSpots(path, w, h)) {
        const crowd = crowding(spot, placed, nodes, points, W, H);
        if (!best || crowd < best.crowd) best = { spot: spot, crowd: crowd };
        if (!crowd) break;
      }
      label.setAttribute("x", best.spot.x);
      label.setAttribute("y", best.spot.y + above);
      placed.push(best.spot);
    }
  }

  function pointsAlong(path, step) {
    const length = path.getTotalLength();
    const out = [];
    for (let s = 0; s <= length; s += step) out.push(path.getPointAtLength(s));
    return out;
  }

  /** Boxes (x, y, w, h) for a label: at points along the path, offset across it on each side. */
  function* labelSpots(path, w, h) {
    const length = path.getTotalLength();
    for (const gap of [3, 8, 16, 26]) {
      for (const t of [0.5, 0.4, 0.6, 0.3, 0.7, 0.2, 0.8]) {
        const p = path.getPointAtLength(length * t);
        const q = path.getPointAtLength(Math.min(length, length * t + 2));
        const o = path.getPointAtLength(Math.max(0, length * t - 2));
        const dx = q.x - o.x, dy = q.y - o.y, norm = Math.hypot(dx, dy) || 1;
        const nx = -dy / norm, ny = dx / norm; // across the edge
        const reach = gap + Math.abs(nx) * w / 2 + Math.abs(ny) * h / 2;
        for (const side of [1, -1]) {
          const cx = p.x + side * nx * reach, cy = p.y + side * ny * reach;
          yield { x: cx - w / 2, y: cy - h / 2, w: w, h: h };
        }
      }
    }
  }

  /** How much a label box collides: other labels and routes count most, edges' points one each. */
  function crowding(box, labels, nodes, points, W, H) {
    const hits = (r, m) => box.x < r.x + r.w + m && r.x < box.x + box.w + m && box.y < r.y + r.h + m && r.y < box.y + box.h + m;
    let n = 0;
    if (box.x < 0 || box.y < 0 || box.x + box.w > W || box.y + box.h > H - 14) n += 100;
    for (const r of labels) if (hits(r, 2)) n += 50;
    for (const r of nodes) if (hits(r, 2)) n += 50;
    for (const p of points) if (p.x > box.x - 1 && p.x < box.x + box.w + 1 && p.y > box.y - 1 && p.y < box.y + box.h + 1) n += 1;
    return n;
  }

  function showRouteDetail(n) {
    const box = $("route-detail");
    box.textContent = "";
    const title = el("div");
    title.appendChild(el("strong", "", n.name));
    if (n.description) title.appendChild(document.createTextNode(" — " + n.description));
    box.appendChild(title);
    const tools = el("div", "muted");
    tools.textContent = "tools: " + (n.tools.length ? n.tools.join(", ") : "none") + (n.roles.length ? " · roles: " + n.roles.join(", ") : "");
    box.appendChild(tools);
  }

  /** With several bots served, a menu to go to another bot's page. */
  async function showBotSwitch() {
    const headers = TOKEN ? { Authorization: "Bearer " + TOKEN } : {};
    const bots = await fetch("/bots", { headers: headers }).then((r) => (r.ok ? r.json() : [])).catch(() => []);
    if (bots.length < 2) return;
    const select = $("bot-switch");
    for (const b of bots) {
      const option = el("option", "", b.name);
      option.value = b.name;
      option.selected = b.name === BOT;
      select.appendChild(option);
    }
    select.hidden = false;
    $("bot-name").hidden = true;
    select.addEventListener("change", () => {
      location.href = "/bots/" + encodeURIComponent(select.value) + "/";
    });
  }

  // -- attachments: files a message carries (docs/protocol.md, "Attachments") -----------------
  // Chosen files wait in the tray (a thumbnail or a name+size chip each, removable) until the
  // message is sent: then each is uploaded over HTTP and the WebSocket frame carries only the
  // references. What the current route's `attachments:` refuses is refused here first, naming
  // the limit; the server checks again and its refusal is shown the same way.

  const tray = []; // {file, preview (object URL of an image) or null}
  const sentImages = new Map(); // ref -> object URL of an image this page sent or fetched
  let attachRoute = null; // the route whose limits the tray follows

  function attachLimits() {
    const node = graph && attachRoute && graph.nodes.find((n) => n.name === attachRoute);
    return (node && node.attachments) || null;
  }

  /** A number in the page's locale (its separators; always Latin digits, as the bot's limits are written). */
  function formatNumber(n, fractionDigits) {
    const options = { maximumFractionDigits: fractionDigits || 0, numberingSystem: "latn" };
    try {
      return new Intl.NumberFormat(pageData.lang, options).format(n);
    } catch (err) { // a tag the browser does not know
      return new Intl.NumberFormat("en", options).format(n);
    }
  }

  /** Sizes in decimal units, as bot authors write limits (max_bytes: 5000000 is "5 MB"). */
  function formatSize(bytes) {
    if (bytes < 1000) return txCount("size_bytes", bytes, { n: formatNumber(bytes) });
    if (bytes < 1000 * 1000) return tx("size_kb", { n: formatNumber(bytes / 1000, 1) });
    return tx("size_mb", { n: formatNumber(bytes / (1000 * 1000), 1) });
  }

  function kindTaken(limits, type) {
    const major = (type || "").split("/")[0];
    return limits.kinds.some((k) => k === type || k === major + "/*" || k === "*/*");
  }

  /** Why the current route refuses this file on top of those in the tray, naming the limit, or null. */
  function attachRefusal(limits, file) {
    const name = file.name || tx("file");
    if (!limits) return tx("attach_none", { route: routeTitle(attachRoute) });
    if (tray.length >= limits.max_count) return tx("attach_count", { count: limits.max_count, name: name });
    if (!kindTaken(limits, file.type)) {
      const kinds = limits.kinds.join(", ");
      return file.type ? tx("attach_kind", { name: name, type: file.type, kinds: kinds })
        : tx("attach_kind_unknown", { name: name, kinds: kinds });
    }
    if (file.size > limits.max_bytes) {
      // Rounded sizes that read the same ("5 MB, over the limit of 5 MB") are given in bytes.
      const exact = formatSize(file.size) === formatSize(limits.max_bytes);
      const size = (n) => (exact ? txCount("size_bytes", n, { n: formatNumber(n) }) : formatSize(n));
      return tx("attach_size", { name: name, size: size(file.size), limit: size(limits.max_bytes) });
    }
    return null;
  }

  function showAttachProblem(text) {
    const box = $("attach-problem");
    box.textContent = text || "";
    box.hidden = !text;
  }

  /** Files from the button, a paste or a drop: each taken into the tray, or refused saying why. */
  function addFiles(files) {
    const refusals = [];
    for (const file of Array.from(files || [])) {
      const why = attachRefusal(attachLimits(), file);
      if (why) refusals.push(why);
      else tray.push({ file: file, preview: file.type.startsWith("image/") ? URL.createObjectURL(file) : null });
    }
    showAttachProblem(refusals.join(" "));
    renderTray();
  }

  function removeFromTray(index) {
    const [gone] = tray.splice(index, 1);
    if (gone && gone.preview) URL.revokeObjectURL(gone.preview);
    showAttachProblem("");
    renderTray();
    (tray.length ? $("attach-tray").querySelector(".attach-remove") : ui.input).focus();
  }

  function clearTray(keepPreviews) {
    for (const item of tray.splice(0)) if (item.preview && !keepPreviews) URL.revokeObjectURL(item.preview);
    renderTray();
  }

  /** A preview: an image's thumbnail or a file's name and size; `onRemove` adds a remove button. */
  function attachmentNode(name, type, size, imageUrl, onRemove) {
    const isImage = imageUrl !== null && imageUrl !== undefined; // "": an image still loading
    const item = el(onRemove ? "li" : "div", "attachment" + (isImage ? " image" : " file"));
    item.dataset.name = name;
    item.dataset.type = type;
    if (isImage) {
      const img = el("img");
      if (imageUrl) img.src = imageUrl;
      img.alt = name;
      item.appendChild(img);
    } else {
      item.appendChild(el("span", "attachment-icon", "📄")).setAttribute("aria-hidden", "true");
      const label = el("span", "attachment-label");
      label.appendChild(el("span", "attachment-name", name));
      label.appendChild(el("span", "attachment-size", size ? formatSize(size) : type));
      item.appendChild(label);
    }
    item.title = name + " (" + type + (size ? ", " + formatSize(size) : "") + ")";
    if (onRemove) {
      const remove = el("button", "attach-remove", "×");
      remove.type = "button";
      remove.setAttribute("aria-label", tx("remove_file", { name: name }));
      remove.addEventListener("click", onRemove);
      item.appendChild(remove);
    }
    return item;
  }

  function renderTray() {
    const box = $("attach-tray");
    box.textContent = "";
    tray.forEach((t, i) => box.appendChild(attachmentNode(t.file.name || tx("file"), t.file.type, t.file.size, t.preview,
      () => removeFromTray(i))));
    box.hidden = tray.length === 0;
  }

  /** The attach button follows the current route: hidden where it takes no files, its file
   * picker offering the kinds it takes; files in the tray that it refuses are dropped, saying why. */
  function attachmentsFollowRoute(route) {
    if (route) attachRoute = route;
    const limits = attachLimits();
    const button = $("attach");
    button.hidden = !limits;
    button.disabled = Boolean(ended);
    $("attach-input").accept = limits ? limits.kinds.join(",") : "";
    showAttachLimits();
    if (tray.length && !limits) {
      clearTray();
      showAttachProblem(tx("attach_removed", { route: routeTitle(attachRoute) }));
    }
  }

  /** The attach button's description (for a screen reader): what the current route takes. */
  function showAttachLimits() {
    const limits = attachLimits();
    $("attach-limits").textContent = limits
      ? tx("attach_limits", { count: limits.max_count, size: formatSize(limits.max_bytes), kinds: limits.kinds.join(", ") }) : "";
  }

  function readBase64(file) {
    return new Promise((resolve, reject) => {
      const reader = new FileReader();
      reader.onload = () => resolve(String(reader.result).replace(/^data:[^,]*,/, ""));
      reader.onerror = () => reject(new Error(tx("unreadable", { name: file.name })));
      reader.readAsDataURL(file);
    });
  }

  /** Upload the tray's files to the session (JSON with base64, as every body) and return
   * their references; a refusal throws the server's message, which names the limit. */
  async function uploadTray() {
    const refs = [];
    for (const item of tray) {
      const body = { media_type: item.file.type || "application/octet-stream", name: item.file.name || "", data: await readBase64(item.file) };
      const ref = await api("/sessions/" + encodeURIComponent(session.chatId) + "/attachments", {
        method: "POST", body: JSON.stringify(body), headers: { "Content-Type": "application/json" },
      });
      if (item.preview) sentImages.set(ref.ref, item.preview);
      refs.push(ref);
    }
    return refs;
  }

  /** A sent message's files in its bubble: images as thumbnails (this page's copy, else read
   * from the session's uploads), other files as chips. */
  function showSentAttachments(bubble, attachments) {
    if (!attachments || !attachments.length) return;
    const box = el("div", "msg-attachments");
    for (const a of attachments) {
      const isImage = String(a.media_type).startsWith("image/") && !/^https?:/.test(a.ref);
      const node = attachmentNode(a.name || tx(isImage ? "image" : "file"), a.media_type, a.size, isImage ? sentImages.get(a.ref) || "" : null);
      if (isImage && !sentImages.has(a.ref)) loadSentImage(node.querySelector("img"), a);
      box.appendChild(node);
    }
    bubble.insertBefore(box, bubble.firstChild);
  }

  async function loadSentImage(img, a) {
    const headers = TOKEN ? { Authorization: "Bearer " + TOKEN } : {};
    const path = "/bots/" + encodeURIComponent(BOT) + "/sessions/" + encodeURIComponent(session.chatId)
      + "/attachments/" + encodeURIComponent(a.ref);
    try {
      const r = await fetch(path, { headers: headers });
      if (!r.ok) throw new Error(r.statusText);
      const url = URL.createObjectURL(new Blob([await r.blob()], { type: a.media_type }));
      sentImages.set(a.ref, url);
      img.src = url;
    } catch (err) {
      img.alt = tx("image_gone", { name: a.name || tx("image") });
    }
  }

  /** A memory message's content: text, or (a message with files) its parts, each file as the
   * reference line the memory keeps (`[attached: parcel.png (image/png, 312 bytes)]`). */
  function memoryText(content) {
    if (!Array.isArray(content)) return content;
    return content.map((p) => (p.type === "text" ? p.text : "[" + p.type + "]")).join("\n");
  }

  function setUpAttachments() {
    const input = $("attach-input");
    $("attach").addEventListener("click", () => input.click());
    input.addEventListener("change", () => { addFiles(input.files); input.value = ""; });
    ui.input.addEventListener("paste", (ev) => {
      const files = Array.from((ev.clipboardData && ev.clipboardData.files) || []);
      if (!files.length) return; // text: the ordinary paste
      ev.preventDefault();
      addFiles(files);
    });
    const chat = document.querySelector(".chat");
    const carriesFiles = (ev) => ev.dataTransfer && Array.from(ev.dataTransfer.types || []).includes("Files");
    let depth = 0; // dragenter/dragleave fire for every child crossed
    chat.addEventListener("dragenter", (ev) => {
      if (!carriesFiles(ev)) return;
      depth += 1;
      $("drop-hint").hidden = false;
    });
    chat.addEventListener("dragleave", () => {
      depth = Math.max(0, depth - 1);
      if (!depth) $("drop-hint").hidden = true;
    });
    chat.addEventListener("dragover", (ev) => { if (carriesFiles(ev)) ev.preventDefault(); });
    chat.addEventListener("drop", (ev) => {
      depth = 0;
      $("drop-hint").hidden = true;
      if (!ev.dataTransfer || !ev.dataTransfer.files.length) return;
      ev.preventDefault();
      if (!ended) addFiles(ev.dataTransfer.files);
    });
  }

  // -- scrolling, theme ----------------------------------------------------------------------

  function setUpScrolling() {
    ui.messages.addEventListener("scroll", () => {
      following = atBottom();
      showToBottom(!following);
    }, { passive: true });
    // The end left the view just after the chat grew (not because the reader scrolled a while
    // later), while the reader was at the bottom: growth anchoring could not follow.
    new IntersectionObserver((entries) => {
      const entry = entries[entries.length - 1];
      if (!entry.isIntersecting && following && entry.time - grewAt < 1000) {
        ui.messages.scrollTop = ui.messages.scrollHeight;
      }
    }, { root: ui.messages }).observe(ui.end);
    $("to-bottom").addEventListener("click", () => {
      scrollDown(true);
      ui.input.focus({ preventScroll: true });
    });
  }

  /** Dark or light: the reader's choice (kept in localStorage), else the system's. */
  function setUpTheme() {
    const button = $("theme");
    const root = document.documentElement;
    const systemDark = window.matchMedia("(prefers-color-scheme: dark)");
    const isDark = () => (root.dataset.theme ? root.dataset.theme === "dark" : systemDark.matches);
    const show = () => button.setAttribute("aria-pressed", String(isDark()));
    button.addEventListener("click", () => {
      root.dataset.theme = isDark() ? "light" : "dark";
      try { localStorage.setItem("chatrun:theme", root.dataset.theme); } catch (err) { /* private mode */ }
      show();
    });
    systemDark.addEventListener("change", show);
    show();
  }

  // -- start --------------------------------------------------------------------------------

  async function main() {
    applyPageTexts();
    $("bot-name").textContent = BOT;
    document.title = MODE === "user" ? tx("chat_title") : BOT + " · chatrun";
    try {
      const info = await api("?locale=" + encodeURIComponent(LOCALE));
      $("bot-description").textContent = info.description || "";
      graph = info.graph;
      renderBreadcrumb([info.default_route]);
      drawGraph(info.graph, [info.default_route]);
      attachmentsFollowRoute(info.default_route);
    } catch (err) {
      if (err.status === 401 && await renewed(err.message)) return main();
      if (err.status === 401) showUnauthorized(err.message);
      else setStatusText("offline", "unreachable");
      return;
    }
    if (MODE === "author") showBotSwitch();
    try {
      await openClient();
    } catch (err) {
      setStatus("offline", err.message || "cannot connect");
      return;
    }
    await startSession();
    renewals = 0;
    setStatusText("online", "connected");
    document.body.dataset.ready = "true";
    refreshInspector();
    // While the page waits for the first message: compiling the Markdown code then spares the
    // first streamed reply's redraws (markdown.js, warm).
    (window.requestIdleCallback || ((run) => setTimeout(run, 200)))(() => ChatrunMarkdown.warm());
  }

  async function openClient() {
    client = new ChatScopesClient();
    await client.open(wsUrl());
    client.websocket.addEventListener("close", async (ev) => {
      if (ev.code === 4401 && !(await renewed(ev.reason))) {
        showUnauthorized(ev.reason);
        return;
      }
      setStatusText("offline", "reconnecting");
      reconnect(); // with a renewed token: the same session, what was typed still in the box
    });
  }

  let failures = 0; // reconnections tried since the page was last connected (the pause grows)
  let renewals = 0; // tokens renewed since then: one, so a fresh token refused at once is not asked for again

  /** The server refused the page's token (an identity that expired): whether a fresh one came
   * from `ChatrunPage.renewToken` (the widget's panel asks the host page), now the page's. Asked
   * once until the page is connected again: a fresh token refused at once is not asked for again. */
  async function renewed(reason) {
    // The first request's refusal may come while the page's last scripts still load (the widget's
    // frame sets renewToken in widget-frame.js, after this one): wait for them, or no one is asked.
    if (document.readyState === "loading") await new Promise((r) => document.addEventListener("DOMContentLoaded", r, { once: true }));
    const renew = window.ChatrunPage && window.ChatrunPage.renewToken;
    if (typeof renew !== "function" || renewals > 0) return false;
    renewals += 1;
    try {
      console.info("chatrun: the token was refused (" + (reason || "") + "): asking for a fresh one");
      const fresh = await renew(reason || "");
      if (typeof fresh !== "string" || !fresh || fresh === TOKEN) return false;
      TOKEN = fresh;
      sessionStorage.setItem(TOKEN_KEY, TOKEN);
      return true;
    } catch (err) {
      return false;
    }
  }

  /** The server went away (restart, network): reopen and resume the same session, which
   * lives in the server's store, with a growing pause between tries. */
  async function reconnect() {
    failures += 1;
    await new Promise((r) => setTimeout(r, Math.min(5000, 250 * failures)));
    let opened = false;
    try {
      await openClient();
      opened = true;
      session = await builder().resume(session.chatId).connect();
      failures = renewals = 0;
      setStatusText("online", "connected");
      // Not awaited: a failed read of the history must not reach the catch below, which starts a
      // new conversation; it gives the message back instead.
      const lost = lostTurn;
      lostTurn = null;
      if (lost) recoverLostTurn(lost).catch(() => giveBack(lost));
      refreshInspector();
    } catch (err) {
      if (opened && client.websocket.readyState === WebSocket.OPEN) {
        // Connected but the session is gone (deleted meanwhile): start a new one.
        localStorage.removeItem(STORE_KEY);
        await startSession();
        setStatusText("online", "connected");
        refreshInspector();
        return;
      }
      // Closed again once open: its close handler goes on (reconnects, renews the token or says
      // why), so this is no second loop of tries; a connection that never opened is tried again.
      if (!opened) reconnect();
    }
  }

  $("composer").addEventListener("submit", (ev) => {
    ev.preventDefault();
    // Enter while a turn runs (the Send button is disabled then, Enter is not) or while the page
    // reconnects sends nothing: what was typed stays in the box, to send once the reply has come.
    if (!accepting()) return;
    const text = ui.input.value;
    ui.input.value = "";
    pingTyping(false);
    send(text);
  });
  ui.input.addEventListener("input", () => pingTyping(Boolean(ui.input.value.trim())));
  ui.input.addEventListener("blur", () => pingTyping(false));
  ui.input.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey) {
      ev.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("reset").addEventListener("click", reset);
  setUpAttachments();
  setUpScrolling();
  setUpTheme();
  setUpPlay();
  window.ChatrunPage = {
    bot: BOT, mode: MODE, session: () => session, client: () => client, api: api, text: tx, renewToken: null,
  };
  $("toggle-inspector").addEventListener("click", () => {
    document.body.classList.toggle(window.innerWidth > 900 ? "no-inspector" : "show-inspector");
    if (graph) drawGraph(graph, inspectData ? inspectData.stack : [graph.default]); // measured only when shown
  });
  main();
})();
