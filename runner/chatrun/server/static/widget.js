/* chatrun's embeddable widget (docs/widget.md). On a page of one of the bot's `widget.origins`:

     <script src="https://CHAT-SERVER/widget.js" data-bot="travel" async></script>
     <script ... data-identity="cw1.…">  (optional: a signed identity the site's backend made)
     <script ... data-identity-refresh="chatIdentity">  (optional: the name of the host page's
       function that gives a fresh identity, or a Promise of one, when the server refuses the
       one it had (expired): the panel goes on with it, no reload; see docs/widget.md)

   puts a launcher button in a corner and, when it is opened, a chat panel: an iframe of the
   chat server's own page (/widget/BOT/frame), so the host page's CSS cannot reach it. The
   launcher lives in a shadow root for the same reason. Visitors without a signed identity get
   an anonymous id kept in this site's localStorage, so their conversation is theirs and comes
   back on the next page load. */
(function () {
  "use strict";
  const script = document.currentScript;
  if (!script || !script.dataset.bot) { console.error("chatrun widget: the <script> tag needs data-bot=\"BOT\""); return; }
  const BOT = script.dataset.bot;
  const SERVER = new URL(script.src, location.href).origin;
  const KEY = "chatrun-widget:" + SERVER + ":" + BOT + ":";
  const store = {  // a page without storage (privacy settings) still gets a widget, for this page view
    get: (k) => { try { return localStorage.getItem(KEY + k); } catch (e) { return null; } },
    set: (k, v) => { try { localStorage.setItem(KEY + k, v); } catch (e) { /* no storage */ } },
  };
  const session = {
    get: (k) => { try { return sessionStorage.getItem(KEY + k); } catch (e) { return null; } },
    set: (k, v) => { try { sessionStorage.setItem(KEY + k, v); } catch (e) { /* no storage */ } },
  };

  function visitorToken() {
    let token = store.get("visitor");
    if (!token) {
      const bytes = crypto.getRandomValues(new Uint8Array(24));
      token = "cwv." + btoa(String.fromCharCode.apply(null, bytes)).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
      store.set("visitor", token);
    }
    return token;
  }

  function token(config) {
    const signed = script.dataset.identity;
    if (signed && config.identity !== "anonymous") return signed;
    return config.identity === "signed" ? "" : visitorToken();
  }

  const CSS = `
    :host { all: initial; }
    .launcher {
      position: fixed; bottom: 20px; z-index: 2147483000; width: 58px; height: 58px; border-radius: 50%;
      border: 0; padding: 0; cursor: pointer; background: var(--accent); color: #fff;
      box-shadow: 0 6px 20px rgba(15, 23, 42, .28); display: grid; place-items: center;
    }
    .launcher:focus-visible { outline: 3px solid var(--accent); outline-offset: 3px; }
    .launcher img { width: 34px; height: 34px; border-radius: 8px; object-fit: contain; }
    .launcher svg { width: 28px; height: 28px; }
    .badge {
      position: absolute; top: -4px; inset-inline-end: -4px; min-width: 22px; height: 22px; padding: 0 6px;
      border-radius: 11px; background: #d6336c; color: #fff; border: 2px solid #fff;
      font: 700 12px/18px system-ui, sans-serif; box-sizing: border-box; text-align: center;
    }
    .panel {
      position: fixed; bottom: 92px; z-index: 2147483001; width: 380px; height: min(640px, calc(100vh - 112px));
      border-radius: 16px; overflow: hidden; background: #fff; box-sizing: border-box;
      box-shadow: 0 12px 48px rgba(15, 23, 42, .32); border: 1px solid rgba(15, 23, 42, .12);
    }
    .panel iframe { width: 100%; height: 100%; border: 0; display: block; }
    .right { right: 20px; } .left { left: 20px; }
    /* start/end: the sides of the host page's line (its <html dir> or CSS direction, which the
       widget's element inherits: :host's "all" leaves direction alone), followed if it changes */
    .start { inset-inline-start: 20px; } .end { inset-inline-end: 20px; }
    [hidden] { display: none !important; }
    @media (max-width: 480px) {
      .panel { inset: 0; width: 100%; height: 100%; border-radius: 0; border: 0; }
      .panel:not([hidden]) ~ .launcher { display: none; }
    }`;
  const BUBBLE = '<svg viewBox="0 0 24 24" aria-hidden="true" focusable="false"><path fill="currentColor" d="M4 4h16a2 2 0 0 1 2 2v10a2 2 0 0 1-2 2H9l-5 4v-4a2 2 0 0 1-2-2V6a2 2 0 0 1 2-2z"/></svg>';

  async function start() {
    let config;
    try {
      const locale = script.dataset.locale ? "?locale=" + encodeURIComponent(script.dataset.locale) : "";
      const answer = await fetch(SERVER + "/widget/" + encodeURIComponent(BOT) + "/config" + locale, { credentials: "omit" });
      config = await answer.json();
      if (!answer.ok) { console.error("chatrun widget refused: " + config.message); return; }
    } catch (err) {
      console.error("chatrun widget: cannot reach " + SERVER + ": " + err); return;
    }
    build(config);
  }

  function build(config) {
    const host = document.createElement("div");
    host.setAttribute("data-chatrun-widget", BOT);
    const root = host.attachShadow({ mode: "open" });
    root.innerHTML = "<style>" + CSS + "</style>";
    host.style.setProperty("--accent", config.color);
    const side = ["left", "right", "start"].includes(config.position) ? config.position : "end";

    const panel = document.createElement("div");
    panel.className = "panel " + side;
    panel.id = "chatrun-panel";
    panel.hidden = true;
    panel.setAttribute("role", "dialog");
    panel.setAttribute("aria-label", config.title);

    const launcher = document.createElement("button");
    launcher.type = "button";
    launcher.className = "launcher " + side;
    launcher.setAttribute("aria-controls", "chatrun-panel");
    launcher.setAttribute("aria-expanded", "false");
    launcher.innerHTML = config.logo ? "" : BUBBLE;
    if (config.logo) { const img = document.createElement("img"); img.src = config.logo; img.alt = ""; launcher.appendChild(img); }
    const badge = document.createElement("span");
    badge.className = "badge";
    badge.hidden = true;
    badge.setAttribute("aria-hidden", "true");  // the launcher's label says the count
    launcher.appendChild(badge);
    const live = document.createElement("span");  // announces new replies while the panel is closed
    live.setAttribute("aria-live", "polite");
    live.style.cssText = "position:absolute;width:1px;height:1px;overflow:hidden;clip:rect(0 0 0 0)";
    root.append(panel, launcher, live);
    document.body.appendChild(host);

    let frame = null;
    let unread = Number(session.get("unread") || 0);
    const texts = config.texts;  // in the visitor's language (the bot's `page.widget_*` texts)
    const label = () => launcher.setAttribute("aria-label", (panel.hidden ? texts.open.replace("{title}", config.title) : texts.close)
      + (unread ? " (" + texts.unread.replace("{count}", unread) + ")" : ""));
    const showBadge = () => { badge.hidden = !unread; badge.textContent = unread > 9 ? "9+" : String(unread); label(); };

    function load() {
      if (frame) return;
      frame = document.createElement("iframe");
      frame.title = config.title;
      const params = new URLSearchParams({ origin: location.origin });
      const tok = token(config);
      if (tok) params.set("token", tok);
      if (script.dataset.locale) params.set("locale", script.dataset.locale);
      frame.src = config.frame + "?" + params.toString();
      panel.appendChild(frame);
    }
    let focusWanted = false;
    function open(restoring) {
      load();
      panel.hidden = false;
      launcher.setAttribute("aria-expanded", "true");
      unread = 0; session.set("unread", "0"); session.set("open", "1"); showBadge();
      if (restoring === true) return;  // reopened after a page load: the host page keeps its focus
      focusWanted = true;
      frame.focus();
      frame.contentWindow.postMessage({ type: "chatrun:focus" }, SERVER);
    }
    function close() {
      panel.hidden = true;
      focusWanted = false;
      launcher.setAttribute("aria-expanded", "false");
      session.set("open", "0"); label();
      launcher.focus();
    }
    launcher.addEventListener("click", () => (panel.hidden ? open() : close()));
    root.addEventListener("keydown", (event) => { if (event.key === "Escape" && !panel.hidden) close(); });
    window.addEventListener("message", (event) => {
      if (event.origin !== SERVER || !frame || event.source !== frame.contentWindow || !event.data) return;
      const type = event.data.type;
      if (type === "chatrun:close") close();
      else if (type === "chatrun:started") store.set("started", "1");
      else if (type === "chatrun:identity-expired") renewIdentity(event.data.id);
      else if (type === "chatrun:ready" && !panel.hidden && focusWanted) frame.contentWindow.postMessage({ type: "chatrun:focus" }, SERVER);
      else if (type === "chatrun:message" && panel.hidden) {
        unread += 1; session.set("unread", String(unread)); showBadge();
        live.textContent = config.title + ": " + (event.data.text || "new message");
      }
    });
    /** The panel's identity was refused (expired): the host page's function named by
     * data-identity-refresh gives a fresh one, which goes to the panel (and into the next panel
     * loaded); without such a function, or when it fails, the panel is told null and says why. */
    function renewIdentity(id) {
      const name = script.dataset.identityRefresh;
      const renew = name ? window[name] : null;
      const answer = (fresh) => frame.contentWindow.postMessage({ type: "chatrun:identity", id: id, token: fresh }, SERVER);
      if (typeof renew !== "function") {
        if (name) console.error("chatrun widget: data-identity-refresh names " + name + ", which is not a function of this page");
        return answer(null);
      }
      Promise.resolve().then(() => renew()).then((given) => {
        const fresh = typeof given === "string" && given ? given : null;
        if (fresh) script.dataset.identity = fresh;
        else console.error("chatrun widget: " + name + "() gave no identity (a cw1. token as text)");
        answer(fresh);
      }, (err) => { console.error("chatrun widget: " + name + "() failed: " + err); answer(null); });
    }
    showBadge();
    if (session.get("open") === "1") open(true);
    else if (store.get("started") === "1") load();  // a conversation exists: its replies count while closed
    host.dataset.ready = "true";
  }

  if (document.body) start(); else document.addEventListener("DOMContentLoaded", start);
})();
