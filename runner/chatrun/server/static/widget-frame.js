/* The widget's panel (server/widget.py): the chat page (app.js) in an iframe on a host site.
   Adds the widget's header (logo, title, a close button) and greeting, and talks to the host
   page's widget.js by postMessage, to that origin only: "chatrun:close" (the close button,
   Esc), "chatrun:message" (a reply arrived: the launcher counts it while closed),
   "chatrun:started" (a conversation exists: load the panel at once on the next page),
   "chatrun:identity-expired" (the server refused the visitor's identity: the host page answers
   "chatrun:identity" with a fresh one, or null; app.js's ChatrunPage.renewToken). Keeps
   the keyboard inside the panel while it is open (a dialog's focus trap). */
(function () {
  "use strict";
  const data = JSON.parse(document.body.dataset.widget || "{}");
  const parentOrigin = data.origin;
  const tell = (type, extra) => { if (window.parent !== window) window.parent.postMessage(Object.assign({ type: type }, extra || {}), parentOrigin); };
  document.body.classList.add("widget", "no-inspector");
  document.documentElement.style.setProperty("--accent", data.color);
  document.documentElement.style.setProperty("--user", data.color);
  document.title = data.title;

  const head = document.createElement("header");
  head.className = "widget-head";
  if (data.logo) {
    const img = document.createElement("img");
    img.src = data.logo; img.alt = "";
    head.appendChild(img);
  }
  const title = document.createElement("h1");
  title.id = "widget-title";
  title.textContent = data.title;
  head.appendChild(title);
  const close = document.createElement("button");
  close.type = "button";
  close.className = "widget-close";
  const pageTexts = JSON.parse(document.getElementById("page-data").textContent).texts || {};
  close.setAttribute("aria-label", pageTexts.widget_close || "Close chat");
  close.textContent = "×";
  close.addEventListener("click", () => tell("chatrun:close"));
  head.appendChild(close);
  document.body.insertBefore(head, document.body.firstChild);
  const chat = document.querySelector(".chat");
  chat.setAttribute("aria-labelledby", "widget-title");

  if (data.greeting) {  // shown until the conversation has a message; never stored in it
    document.body.classList.add("widget-greets");  // instead of the page's own empty-chat line
    const hello = document.createElement("div");
    hello.className = "msg bot widget-greeting";
    hello.textContent = data.greeting;
    chat.insertBefore(hello, document.getElementById("messages"));
  }

  // Replies that arrive after the page is ready count as unread, each once it is complete (app.js's
  // chatrun:message: a streamed reply fires when it ends), with its words for the host page's live
  // region; the history drawn again (a load, a reconnect that recovers a turn) is not new.
  document.addEventListener("chatrun:message", (event) => {
    const said = event.detail;
    if (said.replayed || document.body.dataset.ready !== "true") return;
    if (said.role === "user") return tell("chatrun:started");
    const body = event.target.querySelector(".msg-body") || event.target;
    tell("chatrun:message", { text: (body.textContent || "").trim().slice(0, 140) });
  });
  new MutationObserver(() => { if (document.querySelector("#messages .msg")) tell("chatrun:started"); })
    .observe(document.body, { attributes: true, attributeFilter: ["data-ready"] });

  window.addEventListener("message", (event) => {
    if (event.origin !== parentOrigin || !event.data) return;
    if (event.data.type === "chatrun:focus") document.getElementById("input").focus();
  });

  const FOCUSABLE = "button, [href], input, select, textarea, [tabindex]:not([tabindex='-1'])";
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape") { event.preventDefault(); tell("chatrun:close"); return; }
    if (event.key !== "Tab") return;
    const items = Array.from(document.querySelectorAll(FOCUSABLE))
      .filter((el) => !el.disabled && !el.hidden && el.getClientRects().length > 0);  // shown (SVG too)
    if (!items.length) return;
    const first = items[0], last = items[items.length - 1];
    if (event.shiftKey && document.activeElement === first) { event.preventDefault(); last.focus(); }
    else if (!event.shiftKey && document.activeElement === last) { event.preventDefault(); first.focus(); }
  });
  // An identity the server refused (expired): the host page is asked for a fresh one (its
  // data-identity-refresh function); app.js goes on with it, or says to reload on null.
  const RENEW_WAIT = 30000; // ms: a host page whose widget.js does not answer (an older one)
  window.ChatrunPage.renewToken = (reason) => new Promise((resolve) => {
    if (window.parent === window) return resolve(null);
    const id = String(Math.random()).slice(2);
    const timer = setTimeout(() => done(null), RENEW_WAIT);
    function done(token) { clearTimeout(timer); window.removeEventListener("message", answered); resolve(token); }
    function answered(event) {
      const said = event.data;
      if (event.origin === parentOrigin && event.source === window.parent && said && said.type === "chatrun:identity"
          && said.id === id) done(typeof said.token === "string" ? said.token : null);
    }
    window.addEventListener("message", answered);
    tell("chatrun:identity-expired", { id: id, reason: reason });
  });
  tell("chatrun:ready");
})();
