/* The bot's replies as Markdown: GitHub Flavored Markdown by marked (vendor/marked.min.js), the
 * HTML it makes cleaned before it reaches the page by the browser's HTML Sanitizer API where it has
 * one (Element.setHTML: Chromium), else by DOMPurify (vendor/purify.min.js, loaded only then), both
 * from one allow-list (ALLOWED), so a reply cannot run script, load a frame or style the page. Links
 * open in a new tab without an opener; only http:, https: and mailto: links stay links; images become links to them (a reply
 * does not make the reader's browser fetch anything); HTML in a reply shows as text; headings start
 * at <h3>. Code blocks get a language label, a Copy
 * button and keyboard focus (they scroll sideways); tables scroll inside a focusable box.
 *
 * ChatrunMarkdown.render(text)      -> DocumentFragment (decorated)
 * ChatrunMarkdown.html(text)        -> the cleaned HTML, undecorated (what a GFM renderer makes)
 * ChatrunMarkdown.stream(container, onDraw) -> {append(chunk), finish(text), text()}: a reply as it
 *   streams; onDraw() after each redraw (the page scrolls then).
 *   Redrawn when a chunk comes, at most every 250 ms (in an animation frame, or when the lexer
 *   worker answers: the browser draws the change in its next frame). How often chunks come
 *   is the server's rule: the page asks for a reader's pace (streamEvery "reader":
 *   engine/stream_chunks.py READER: every 250 ms, 500 ms while a reply comes faster than anyone
 *   reads, 2 s while it comes twice as fast again), so each Stream frame received is drawn. Every
 *   block but the last is rendered once and never touched again (so a selection or a hovered link
 *   in it survives later chunks); the growing last one shows its text as it comes, rendered as
 *   Markdown at most every 500 ms. The complete blocks are lexed and made HTML by marked in a
 *   worker (this file, run as one: serveLexer), off the page's main thread; the page cleans,
 *   decorates and inserts what it answers. Where there is no worker (no Worker, or it failed) and
 *   for the reply's end (finish), the page lexes.
 * ChatrunMarkdown.warm(): renders a sample reply off the page once (app.js calls it when the page
 *   is idle), so the first streamed reply does not pay for compiling marked's (and DOMPurify's) code;
 *   starts the lexer worker and has it lex the sample WARM_TIMES times (in the worker).
 * ChatrunMarkdown.texts: {copy, copied, code}: the Copy button's texts (app.js sets them).
 * ChatrunMarkdown.sanitizer: "Sanitizer" (the browser's) or "DOMPurify": the one that cleans. */
(function (global) {
  "use strict";

  // What a reply's HTML may hold once clean: marked's own elements and attributes (HTML written in a
  // reply is escaped below, so nothing else reaches the sanitizer but through a bug), no more. The
  // one allow-list both sanitizers are configured from: the browser's own (the HTML Sanitizer API,
  // whose walk runs in C++: a fifth of DOMPurify's time) where it has one, DOMPurify elsewhere.
  // Images are links (renderer.image below); no `id`/`name` (DOM clobbering), `class`, `style`,
  // form or media element, comment, or `data-` attribute but the code blocks' language.
  const ALLOWED = {
    elements: ["p", "h3", "h4", "h5", "h6", "hr", "br", "blockquote", "ul", "ol", "li", "input", "pre", "code",
      "table", "thead", "tbody", "tr", "th", "td", "strong", "em", "del", "a"],
    attributes: ["href", "title", "align", "start", "type", "checked", "disabled", "data-lang"],
    urls: ["href"], // the attributes that hold an address: SAFE_URL's schemes only
  };
  // DOMPurify's own rule for addresses, with http:, https: and mailto: the only schemes; relative
  // addresses ("/a", "#b", "c/d") pass. Tested without the blanks and controls a browser ignores.
  const SAFE_URL = /^(?:(?:https?|mailto):|[^a-z]|[a-z+.\-]+(?:[^a-z+.\-:]|$))/i;
  const URL_BLANKS = /[\u0000-\u0020\u00A0\u1680\u180E\u2000-\u2029\u205F\u3000]/g; // DOMPurify's ATTR_WHITESPACE
  const escapeHtml = (s) => String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
  if (typeof document === "undefined") { // this file as the page's lexer worker (lexerWorker below)
    global.importScripts("vendor/marked.min.js");
    serveLexer(configured());
    return;
  }
  const md = configured();

  /** marked as chatrun renders replies (the page's and its lexer worker's: the same HTML). */
  function configured() {
    return new global.marked.Marked({
      gfm: true,
      breaks: true, // models mean a single newline as a line break
      renderer: {
        // HTML in a reply shows as the text it is (as in ChatGPT): models quote HTML far more often than
        // they mean to lay out with it. (The sanitizer would clean it; this keeps what was written readable.)
        html(token) {
          return escapeHtml(token.text);
        },
        // A reply's headings sit under the page's own: # is <h3>, ## <h4>, and so on.
        heading(token) {
          const level = Math.min(6, token.depth + 2);
          return "<h" + level + ">" + this.parser.parseInline(token.tokens) + "</h" + level + ">\n";
        },
        image(token) { // a link to the image, not the image: no request to a third party while reading
          return '<a href="' + escapeHtml(token.href) + '">' + escapeHtml(token.text || token.href) + "</a>";
        },
      },
    });
  }

  /** A streaming reply's text split where a later chunk cannot change it: the complete blocks
   * (all but the last, which may still grow), the growing block's tokens, and the length of the
   * text the complete blocks are made of. */
  function splitBlocks(marked, text) {
    const tokens = marked.lexer(text);
    let last = tokens.length - 1;
    while (last > 0 && tokens[last].type === "space") last -= 1;
    const done = last > 0 ? tokens.slice(0, last) : [];
    let consumed = 0;
    for (const token of done) consumed += token.raw.length;
    return { done: done, growing: tokens.slice(Math.max(last, 0)), links: tokens.links, consumed: consumed };
  }

  function blocksHtml(marked, tokens, links) {
    tokens.links = links;
    return marked.parser(tokens);
  }

  /** The worker's side: {id, text, tail} -> {id, html (the complete blocks), consumed, tail (the
   * growing block's HTML, when asked)}; {warm, times}: runs the lexer on a sample, so that V8 has
   * compiled it (in the worker: no cost to the page) before a reply streams. */
  function serveLexer(marked) {
    global.onmessage = (event) => {
      const job = event.data;
      if (job.warm) {
        for (let i = 0; i < job.times; i += 1) blocksHtml(marked, marked.lexer(job.warm), {});
        return;
      }
      const split = splitBlocks(marked, job.text);
      global.postMessage({ id: job.id, consumed: split.consumed,
        html: split.done.length ? blocksHtml(marked, split.done, split.links) : "",
        tail: job.tail ? blocksHtml(marked, split.growing, split.links) : null });
    };
  }

  /** The browser's HTML Sanitizer configured with ALLOWED, or null: none, or one that fails a probe
   * (an older draft of the API, or one that keeps what it should not). */
  function nativeSanitizer() {
    if (typeof Element.prototype.setHTML !== "function" || typeof global.Sanitizer !== "function") return null;
    try {
      const sanitizer = new global.Sanitizer({ elements: ALLOWED.elements, attributes: ALLOWED.attributes,
        comments: false, dataAttributes: false });
      const probe = document.createElement("div");
      probe.setHTML('<p title="t" class="c" id="i" onclick="x()">a<!--c--><b>b</b><script>x()</script>' +
        '<a href="javascript:x()" style="x">l</a><code data-lang="c" data-x="1">c</code></p><form><input name="n"></form>',
      { sanitizer: sanitizer });
      return probe.innerHTML === '<p title="t">a<a>l</a><code data-lang="c">c</code></p>' ? sanitizer : null;
    } catch (error) {
      return null;
    }
  }
  const NATIVE = nativeSanitizer();
  if (!NATIVE && !global.DOMPurify) {
    // DOMPurify only where it cleans: the page's next script, before the page's own that render
    // (a browser with the Sanitizer API does not fetch, parse or compile its 30 KB). Written into
    // the page as it loads, as the tag it replaces was: it runs before the scripts after this one.
    if (document.readyState !== "loading") throw new Error("markdown.js is loaded by a <script> tag of the page");
    document.write('<script src="/_chat/static/vendor/purify.min.js"><\/script>');
  }
  let purifying = false; // DOMPurify configured (at its first use: it is loaded after this script)

  /** DOMPurify's cleaning, configured from ALLOWED once (a config passed to every sanitize() call
   * would be parsed again each time). */
  function purify(html) {
    if (!purifying) configurePurify();
    purifying = true;
    return document.adoptNode(global.DOMPurify.sanitize(html));
  }

  function configurePurify() {
    global.DOMPurify.setConfig({
      ALLOWED_TAGS: ALLOWED.elements,
      ALLOWED_ATTR: ALLOWED.attributes,
      ALLOW_DATA_ATTR: false,
      ALLOW_ARIA_ATTR: false,
      ALLOWED_URI_REGEXP: SAFE_URL,
      // DOMPurify tests every attribute's value with ALLOWED_URI_REGEXP but these: only `urls` hold one.
      ADD_URI_SAFE_ATTR: ALLOWED.attributes.filter((name) => !ALLOWED.urls.includes(name)),
      // The cleaned nodes, not HTML to parse again. (IN_PLACE, cleaning nodes parsed here, walks the
      // tree three more times to guard against a tree changing under it: twice the time.)
      RETURN_DOM_FRAGMENT: true,
    });
  }
  const texts = { copy: "Copy", copied: "Copied", code: "code" };
  // A streaming reply is redrawn at most this often (a floor: the server sends the page's chunks
  // at a reader's pace, engine/stream_chunks.py READER, no more often than this).
  const DRAW_MS = 250;
  const RENDER_MS = 500; // and its growing block rendered as Markdown at most this often
  const WARM_TIMES = 30; // the lexer worker lexes SAMPLE this often when the page is idle after loading
  // Characters streamed replies had parsed again (`offPage`: of them, in the lexer worker), and
  // their redraws, in all (a test reads them).
  const stats = { parsed: 0, offPage: 0, redrawn: 0 };

  /** marked's HTML as a fragment of this page, clean: parsed by the sanitizer in a document of its
   * own (nothing in it loads or runs before it is clean), then only what ALLOWED allows. */
  function clean(html) {
    // The language of a fenced block is its only class worth keeping: carried past the sanitizer.
    html = html.replace(/<code class="language-([\w+#.-]{1,40})">/g, '<code data-lang="$1">');
    if (!NATIVE) return purify(html);
    const box = document.createElement("div");
    box.setHTML(html, { sanitizer: NATIVE }); // drops javascript: addresses, not data: or vbscript:
    const urls = ALLOWED.urls.map((name) => "[" + name + "]").join(",");
    for (const node of box.querySelectorAll(urls)) {
      for (const name of ALLOWED.urls) {
        const value = node.getAttribute(name);
        if (value !== null && !SAFE_URL.test(value.replace(URL_BLANKS, ""))) node.removeAttribute(name);
      }
    }
    const fragment = document.createDocumentFragment();
    fragment.append(...box.childNodes);
    return fragment;
  }

  function cleanHtml(html) {
    const box = document.createElement("div");
    box.appendChild(clean(html));
    return box.innerHTML;
  }

  /** A code block's header: its language and a Copy button. */
  function codeHead(pre, code) {
    const head = document.createElement("div");
    head.className = "code-head";
    const lang = document.createElement("span");
    lang.className = "code-lang";
    lang.textContent = code.dataset.lang || texts.code;
    const copy = document.createElement("button");
    copy.type = "button";
    copy.className = "code-copy";
    copy.textContent = texts.copy;
    copy.addEventListener("click", () => copyText(code.textContent, copy));
    head.append(lang, copy);
    return head;
  }

  function copyText(text, button) {
    const done = () => {
      button.textContent = texts.copied;
      setTimeout(() => { button.textContent = texts.copy; }, 1500);
    };
    if (navigator.clipboard && navigator.clipboard.writeText) navigator.clipboard.writeText(text).then(done, () => undefined);
  }

  /** What the page adds to the cleaned HTML: link targets, code block headers, scroll boxes. */
  function decorate(root) {
    // A link whose address the sanitizer refused (javascript:, data:) is its text alone.
    root.querySelectorAll("a:not([href])").forEach((a) => a.replaceWith(...a.childNodes));
    root.querySelectorAll("a[href]").forEach((a) => {
      a.target = "_blank";
      a.rel = "noopener noreferrer";
    });
    root.querySelectorAll("pre > code").forEach((code) => {
      const pre = code.parentNode;
      const block = document.createElement("div");
      block.className = "code-block";
      pre.tabIndex = 0; // it scrolls sideways: the keyboard must reach it
      pre.parentNode.insertBefore(block, pre);
      block.append(codeHead(pre, code), pre);
    });
    root.querySelectorAll("table").forEach((table) => {
      const box = document.createElement("div");
      box.className = "table-wrap";
      box.tabIndex = 0;
      table.parentNode.insertBefore(box, table);
      box.appendChild(table);
    });
    root.querySelectorAll("input[type=checkbox]").forEach((box) => {
      box.disabled = true;
      const item = box.closest("li");
      if (item) item.classList.add("task");
      box.setAttribute("aria-label", item ? item.textContent.trim().slice(0, 80) : "task");
    });
    return root;
  }

  function render(text) {
    return decorate(clean(md.parse(String(text || ""))));
  }

  function html(text) {
    return cleanHtml(md.parse(String(text || "")));
  }

  // The deepest last block of a rendered tail, where the text that came since its last render is
  // shown as it is (a paragraph's, a list item's, a cell's, a code block's last line).
  const INTO = new Set(["DIV", "P", "UL", "OL", "LI", "PRE", "CODE", "BLOCKQUOTE", "TABLE", "THEAD", "TBODY",
    "TR", "TD", "TH", "H3", "H4", "H5", "H6"]);
  function lastBlock(root) {
    let node = root;
    while (node.lastElementChild && INTO.has(node.lastElementChild.tagName)) node = node.lastElementChild;
    return node;
  }

  // This script's address: the page's lexer worker runs it (serveLexer).
  const SCRIPT = document.currentScript ? document.currentScript.src : null;
  let lexer; // the lexer worker's client (undefined: not started; null: none)

  /** The worker a streaming reply's complete blocks are lexed and made HTML in, off the page's
   * main thread (marked is some 15 ms of a 17 KB reply's there, its lexer's code not yet fast when
   * a reply comes); null where there is none (no Worker, no script address, an error): the page
   * lexes them itself then. */
  function lexerWorker() {
    if (lexer !== undefined) return lexer;
    lexer = null;
    if (typeof global.Worker !== "function" || !SCRIPT) return lexer;
    let worker;
    try {
      worker = new global.Worker(SCRIPT);
    } catch (error) {
      return lexer;
    }
    const waiting = new Map(); // job id -> what to do with its answer
    let next = 0;
    const client = {
      ok: true,
      /** Lex `text` ({tail}: its growing block's HTML too); `then(answer)`, or `then(null)` if
       * the worker failed (its jobs are then done on the page). */
      lex(text, tail, then) {
        next += 1;
        waiting.set(next, then);
        worker.postMessage({ id: next, text: text, tail: tail });
      },
      warm(sample, times) { worker.postMessage({ warm: sample, times: times }); },
    };
    worker.onmessage = (event) => {
      const then = waiting.get(event.data.id);
      waiting.delete(event.data.id);
      if (then) then(event.data);
    };
    worker.onerror = (event) => {
      if (event.preventDefault) event.preventDefault();
      client.ok = false;
      const pending = Array.from(waiting.values());
      waiting.clear();
      for (const then of pending) then(null);
    };
    lexer = client;
    return lexer;
  }

  /** A streaming reply in `container`: settled blocks, then the growing last one.
   *
   * The cost of a redraw is the browser's (style, layout, paint) far more than marked's, so a
   * redraw does little: at most one per animation frame and one per DRAW_MS (the server sends a fast
   * reply's chunks less often: each is drawn); a block is rendered once when it is complete (the
   * next one has begun) and never touched again; the growing block shows its text as a plain text
   * node as it comes (appended to, not replaced) and is rendered as Markdown at most every
   * RENDER_MS, and when the reply finishes. The text is lexed and made HTML in the lexer worker
   * where there is one (the page cleans, decorates and inserts its answer); the reply's end, in
   * finish(), on the page (what was not lexed yet: the last chunks, the growing block).
   * Nothing reads the layout here (the page's onDraw scrolls, once per redraw). */
  function stream(container, onDraw) {
    const settled = document.createElement("div");
    const tail = document.createElement("div");
    settled.className = "md-settled";
    tail.className = "md-tail md-open"; // md-open: the growing block (app.css draws a cursor after it)
    container.append(settled, tail);
    let text = "";
    let offset = 0; // text[0:offset] is rendered in `settled`, for good
    let shown = 0; // text[0:shown] is on the page (rendered, or as plain text at the tail's end)
    let rendered = -Infinity; // when the growing block was last rendered as Markdown
    let raw = null; // the text node the plain text goes to, until the tail is rendered again
    let tailFor = -1; // the text's length when the growing block was last rendered as Markdown
    let asked = null; // the text's length when the lexer worker was asked (null: not waiting)
    let ended = false;

    /** The complete blocks' HTML, once, in a part of their own, appended and never touched again.
     * (Not `content-visibility: auto`: measured, it made each redraw lay the new part out twice
     * and again a frame later, as it entered the view and the one before left it.) */
    function addPart(html, consumed) {
      const part = document.createElement("div");
      part.className = "md-part";
      part.appendChild(decorate(clean(html)));
      settled.appendChild(part);
      offset += consumed;
      // A new growing block: its text as it is, until RENDER_MS from now.
      tail.textContent = "";
      raw = null;
      tailFor = -1;
      shown = offset;
      rendered = performance.now();
    }

    function showTail(html, upTo) {
      tail.replaceChildren(decorate(clean(html)));
      raw = null;
      shown = upTo;
      rendered = performance.now();
      tailFor = upTo;
    }

    function appendRaw() {
      if (shown === text.length) return;
      if (!raw) {
        const span = document.createElement("span");
        span.className = "md-raw";
        raw = span.appendChild(document.createTextNode(""));
        lastBlock(tail).appendChild(span);
      }
      raw.appendData(text.slice(shown));
      shown = text.length;
    }

    /** On the page: lex what is not settled, render its complete blocks, then the tail. */
    function redraw(full) {
      stats.parsed += text.length - offset;
      const split = splitBlocks(md, text.slice(offset));
      if (split.done.length) addPart(blocksHtml(md, split.done, split.links), split.consumed);
      if (full || performance.now() - rendered >= RENDER_MS) showTail(blocksHtml(md, split.growing, split.links), text.length);
      else appendRaw();
    }

    /** The lexer worker's answer for text[offset:upTo] (null: the worker failed: the page lexes). */
    function answered(answer, from, upTo) {
      asked = null;
      if (ended || from !== offset) return;
      if (!answer) {
        redraw(false);
      } else {
        stats.offPage += upTo - from;
        if (answer.html) addPart(answer.html, answer.consumed);
        if (answer.tail !== null && !answer.html) showTail(answer.tail, upTo);
        appendRaw();
      }
      // The page changed now: the next redraw is DRAW_MS after this, however long the worker took
      // (counted from the question, a late answer left the next one less than DRAW_MS later).
      drawn = performance.now();
      if (onDraw) onDraw();
      if (shown < text.length) later(); // chunks came while the worker lexed
    }

    // However fast chunks come (a client asking for no pace gets them 20 times a second), at most
    // one redraw per DRAW_MS: in an animation frame (where the browser lays out and paints anyway),
    // or when the lexer worker answers.
    let timer = null;
    let frame = null;
    let drawn = -Infinity;
    function draw() {
      frame = null;
      drawn = performance.now();
      stats.redrawn += 1;
      const worker = lexerWorker();
      if (worker && worker.ok) {
        const from = offset;
        const upTo = text.length;
        asked = upTo;
        stats.parsed += upTo - from;
        const tailToo = performance.now() - rendered >= RENDER_MS;
        worker.lex(text.slice(from), tailToo, (answer) => answered(answer, from, upTo));
        return;
      }
      redraw(false);
      if (onDraw) onDraw();
    }
    // With the lexer worker the page changes nothing until it answers: it is asked at once (its
    // answer then often comes before the reply's Message, which would otherwise lex on the page).
    function schedule() {
      timer = null;
      const worker = lexerWorker();
      if (worker && worker.ok) draw();
      else frame = requestAnimationFrame(draw);
    }
    function later() {
      if (timer !== null || frame !== null || asked !== null) return;
      const wait = DRAW_MS - (performance.now() - drawn);
      if (wait > 0) timer = setTimeout(schedule, wait);
      else schedule(); // the usual case: chunks come at the server's pace
    }
    function cancel() {
      clearTimeout(timer);
      cancelAnimationFrame(frame);
      timer = frame = null;
    }

    return {
      append(chunk) {
        text += String(chunk).replace(/\r\n?/g, "\n");
        later();
      },
      /** The whole reply: when it is what was streamed only the tail is rendered again, unless the
       * last redraw rendered it as it is (a fast reply's last chunk, sent when the model's answer
       * ended, is often drawn before the Message comes: the same render again is a layout and a
       * paint of the reply's end for nothing). A lexer worker's answer still to come is not used. */
      finish(full) {
        cancel();
        ended = true;
        tail.classList.remove("md-open");
        if (typeof full === "string" && full.replace(/\r\n?/g, "\n") !== text) {
          text = full;
          offset = 0;
          settled.textContent = "";
          container.replaceChildren(settled, tail);
          // One full render: reference links and the like see the whole reply.
          settled.appendChild(render(full));
          tail.textContent = "";
          return;
        }
        if (tailFor !== text.length) redraw(true);
      },
      text() { return text; },
    };
  }

  // A reply with what models write (each kind of block marked and DOMPurify have code for).
  const SAMPLE = "### A heading\n\nA paragraph with **bold**, *italics*, ~~struck~~, `code`, a " +
    "[link](https://example.org/a) and https://example.org/b.\n\n- one\n  - nested\n- [x] done\n\n" +
    "1. first\n2. second\n\n> quoted\n\n```js\nlet a = 1;\n```\n\n| a | b |\n|---|--:|\n| 1 | 2 |\n\n---\n";

  /** Runs the streaming renderer once on SAMPLE in a box that is not on the page (no style,
   * layout or paint): V8 compiles marked's and DOMPurify's code when it first runs it, some 10-20 ms
   * on a slow machine that the first streamed reply would otherwise pay in its first redraws. */
  function warm() {
    const box = document.createElement("div");
    const before = Object.assign({}, stats);
    const reply = stream(box);
    reply.append(SAMPLE);
    reply.finish();
    Object.assign(stats, before); // not a reply's
    // The worker's marked too, where it costs the page nothing: V8 compiles code that has run often.
    const worker = lexerWorker();
    if (worker) worker.warm(SAMPLE, WARM_TIMES);
  }

  // `marked`: the configured marked (a test renders XSS vectors through it).
  // `sanitizer`: which one cleans ("Sanitizer", the browser's, or "DOMPurify"; a test runs both).
  global.ChatrunMarkdown = { render: render, html: html, stream: stream, warm: warm, texts: texts, stats: stats,
    marked: md, sanitizer: NATIVE ? "Sanitizer" : "DOMPurify" };
})(typeof window !== "undefined" ? window : self); // self: in the lexer worker
