/* Stop and feedback on chatrun's page (issue 35), built on app.js's hooks (its header names
 * them: chatrun:message, chatrun:turn-start, chatrun:turn-end, window.ChatrunPage):
 *
 * - Stop: while a turn runs, a Stop button takes the place of Send. It sends a Cancel frame
 *   (chatscopes.js session.cancel()): the turn is rolled back, the reply shown so far stays on
 *   the screen, and the history records the attempt as stopped (docs/protocol.md, "Stop").
 * - Feedback: thumbs up/down in the action bar of each bot reply of a committed turn; thumbs
 *   down opens an optional comment. Sent with POST .../sessions/{id}/feedback (the page's token),
 *   kept with the turn (docs/protocol.md, "Feedback").
 *
 * A reply learns its turn number from the session's history (`turn` of the entry whose Message
 * it shows): replies of a stopped or failed turn get no thumbs (there is no turn to rate). */
(function () {
  "use strict";

  const texts = (JSON.parse(document.getElementById("page-data").textContent) || {}).texts || {};
  const tx = (key, fallback) => (texts[key] !== undefined ? texts[key] : fallback);
  const page = () => window.ChatrunPage;

  const THUMB = '<svg viewBox="0 0 24 24" aria-hidden="true" focusable="false"><path d="M7 10v11H3V10h4Zm2 11h8.3a2 2 0 0 0 2-1.6l1.4-7A2 2 0 0 0 18.7 10H14V5.5A2.5 2.5 0 0 0 11.5 3L9 10v11Z" fill="none" stroke="currentColor" stroke-width="2" stroke-linejoin="round"/></svg>';

  // Styles of these controls only, with app.css's colours (light and dark follow its variables).
  const style = document.createElement("style");
  style.textContent = [
    ".btn.stop { background: var(--panel); color: var(--ink); border: 1px solid var(--line); }",
    ".btn.stop::before { content: ''; display: inline-block; width: .7em; height: .7em; margin-inline-end: .45em;",
    "  background: currentColor; border-radius: 2px; vertical-align: -.05em; }",
    ".msg-action.rate-down svg { transform: rotate(180deg); }",
    ".msg-action.rate[aria-pressed='true'] { color: var(--accent); opacity: 1; }",
    ".feedback-form { display: flex; gap: 6px; margin-top: 6px; }",
    ".feedback-form textarea { flex: 1; font: inherit; font-size: 13px; min-height: 2.2em; resize: vertical;",
    "  color: var(--ink); background: var(--bg); border: 1px solid var(--line); border-radius: 8px; padding: 4px 8px; }",
    ".feedback-thanks { font-size: 12px; color: var(--muted); margin-top: 4px; }",
  ].join("\n");
  document.head.appendChild(style);

  // -- Stop ----------------------------------------------------------------------------------------

  const send = document.getElementById("send");
  const stop = document.createElement("button");
  stop.type = "button";
  stop.id = "stop";
  stop.className = "btn stop";
  stop.hidden = true;
  stop.dataset.pageText = "stop"; // app.js renames it with the session's locale, as its own controls
  stop.textContent = tx("stop", "Stop");
  send.after(stop);

  let running = false;
  stop.addEventListener("click", () => {
    const session = page() && page().session();
    if (!session || typeof session.cancel !== "function") return;
    stop.disabled = true;
    session.cancel().catch(() => undefined); // the turn's own request reports how it ended
  });

  // -- which turn each reply belongs to ------------------------------------------------------------

  let live = []; // [bubble, actions] of replies shown while this page's turn runs
  let unnumbered = []; // replies whose turn is looked up in the history (replayed, others', committed)
  let lookup = null;

  document.addEventListener("chatrun:turn-start", () => {
    running = true;
    live = [];
    stop.hidden = false;
    stop.disabled = false;
    send.hidden = true;
    stop.focus({ preventScroll: true });
  });

  document.addEventListener("chatrun:turn-end", (event) => {
    const hadFocus = document.activeElement === stop;
    running = false;
    stop.hidden = true;
    send.hidden = false;
    // Focus goes back to the box (a selection the reader made in the chat stays theirs).
    if (hadFocus && getSelection().isCollapsed) document.getElementById("input").focus({ preventScroll: true });
    // A stopped or failed turn was rolled back: its replies have no turn to rate.
    if (event.detail && event.detail.ok) unnumbered = unnumbered.concat(live);
    live = [];
    numberSoon();
  });

  document.addEventListener("chatrun:message", (event) => {
    const detail = event.detail || {};
    if (detail.role !== "bot" || !detail.actions) return;
    const reply = [event.target, detail.actions];
    if (typeof detail.turn === "number") addRating(reply, detail.turn);
    else if (running && !detail.replayed) live.push(reply);
    else {
      unnumbered.push(reply);
      numberSoon();
    }
  });

  /** Number the waiting replies from the history, once the events that showed them are done. */
  function numberSoon() {
    if (!unnumbered.length || lookup) return;
    lookup = setTimeout(() => {
      lookup = null;
      number().catch(() => undefined);
    }, 0);
  }

  /** The replies shown last are the history's last Messages: match them from the end. */
  async function number() {
    const session = page() && page().session();
    if (!session) return;
    const replies = unnumbered;
    unnumbered = [];
    const data = await page().api("/sessions/" + encodeURIComponent(session.chatId));
    const turns = [];
    for (const entry of data.history || []) {
      for (const e of entry.events || []) {
        const mine = e.type === "Message" && (!e.audience || e.audience === "user") && !(e.meta && e.meta.from);
        if (mine) turns.push(entry.ok ? entry.turn : null);
      }
    }
    for (let i = replies.length - 1, j = turns.length - 1; i >= 0 && j >= 0; i -= 1, j -= 1) {
      if (typeof turns[j] === "number") addRating(replies[i], turns[j]);
    }
  }

  // -- thumbs up / down ------------------------------------------------------------------------------

  function addRating(reply, turn) {
    const [bubble, actions] = reply;
    if (actions.querySelector(".rate")) return;
    const up = rateButton("up", tx("rate_up", "Good reply"));
    const down = rateButton("down", tx("rate_down", "Bad reply"));
    up.addEventListener("click", () => rate(bubble, turn, "up", [up, down]));
    down.addEventListener("click", () => askWhy(bubble, turn, [up, down]));
    actions.append(up, down);
    bubble.dataset.turn = String(turn);
  }

  function rateButton(rating, label) {
    const button = document.createElement("button");
    button.type = "button";
    button.className = "msg-action rate rate-" + rating;
    button.innerHTML = THUMB; // a constant
    button.dataset.pageLabel = "rate_" + rating;
    button.setAttribute("aria-label", label);
    button.setAttribute("aria-pressed", "false");
    button.title = label;
    return button;
  }

  async function rate(bubble, turn, rating, buttons, comment) {
    const session = page().session();
    const body = { turn: turn, rating: rating };
    if (comment) body.comment = comment;
    await page().api("/sessions/" + encodeURIComponent(session.chatId) + "/feedback", {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
    });
    for (const b of buttons) b.setAttribute("aria-pressed", String(b.classList.contains("rate-" + rating)));
    const old = bubble.querySelector(".feedback-form, .feedback-thanks");
    if (old) old.remove();
    const thanks = document.createElement("div");
    thanks.className = "feedback-thanks";
    thanks.setAttribute("role", "status");
    thanks.textContent = tx("feedback_thanks", "Thanks for your feedback");
    bubble.appendChild(thanks);
  }

  /** Thumbs down: an optional comment first (Enter or the button sends; empty is fine). */
  function askWhy(bubble, turn, buttons) {
    if (bubble.querySelector(".feedback-form")) return;
    const form = document.createElement("form");
    form.className = "feedback-form";
    const text = document.createElement("textarea");
    text.rows = 1;
    text.maxLength = 2000;
    text.placeholder = tx("feedback_placeholder", "What was wrong? (optional)");
    text.setAttribute("aria-label", text.placeholder);
    const submit = document.createElement("button");
    submit.type = "submit";
    submit.className = "btn primary";
    submit.textContent = tx("feedback_send", "Send feedback");
    form.append(text, submit);
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      submit.disabled = true;
      rate(bubble, turn, "down", buttons, text.value.trim()).catch(() => { submit.disabled = false; });
    });
    text.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey) {
        event.preventDefault();
        form.requestSubmit();
      }
    });
    bubble.appendChild(form);
    text.focus();
  }
})();
