/* The bot's replies as Markdown: GitHub Flavored Markdown by marked (vendor/marked.min.js), the
 * HTML it makes cleaned by DOMPurify (vendor/purify.min.js) before it reaches the page, so a
 * reply cannot run script, load a frame or style the page. Links open in a new tab without an
 * opener; only http:, https: and mailto: links stay links; images become links to them (a reply
 * does not make the reader's browser fetch anything); HTML in a reply shows as text; headings start
 * at <h3>. Code blocks get a language label, a Copy
 * button and keyboard focus (they scroll sideways); tables scroll inside a focusable box.
 *
 * ChatrunMarkdown.render(text)      -> DocumentFragment (decorated)
 * ChatrunMarkdown.html(text)        -> the cleaned HTML, undecorated (what a GFM renderer makes)
 * ChatrunMarkdown.stream(container, onDraw) -> {append(chunk), finish(text), text()}: a reply as it
 *   streams; onDraw() after each redraw (the page scrolls then).
 *   Only the last block is rendered again as chunks come, at most every 100 ms; every block before
 *   it is rendered once and never touched again (so the cost is linear in the reply, and a
 *   selection or a hovered link in it survives later chunks).
 * ChatrunMarkdown.texts: {copy, copied, code}: the Copy button's texts (app.js sets them). */
(function (global) {
  "use strict";

  // DOMPurify's own rule for attribute values, with http:, https: and mailto: the only schemes (it
  // checks every attribute with it: a value without a scheme, "3" or "checkbox", must pass).
  const SAFE_URL = /^(?:(?:https?|mailto):|[^a-z]|[a-z+.\-]+(?:[^a-z+.\-:]|$))/i;
  const escapeHtml = (s) => String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
  const md = new global.marked.Marked({
    gfm: true,
    breaks: true, // models mean a single newline as a line break
    renderer: {
      // HTML in a reply shows as the text it is (as in ChatGPT): models quote HTML far more often than
      // they mean to lay out with it. (DOMPurify would clean it; this keeps what was written readable.)
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
  // Set once: a config passed to every sanitize() call would be parsed again each time.
  global.DOMPurify.setConfig({
    ALLOWED_URI_REGEXP: SAFE_URL,
    FORBID_TAGS: ["style", "img", "form", "button", "textarea", "select", "iframe", "svg", "math"],
    FORBID_ATTR: ["style", "id", "class"], // `class` comes back for code blocks' language below
    ADD_ATTR: ["target"],
    IN_PLACE: true, // cleans the nodes given (parsed in INERT, below): no new document per call
  });
  const texts = { copy: "Copy", copied: "Copied", code: "code" };
  const RENDER_MS = 100;
  const stats = { parsed: 0 }; // characters streamed replies had parsed again, in all (a test reads it)

  // marked's HTML is parsed in a document of its own, with no window: nothing in it loads or runs.
  const INERT = document.implementation.createHTMLDocument("");

  /** marked's HTML as a fragment of this page, cleaned by DOMPurify (in place, in INERT) first. */
  function clean(html) {
    // The language of a fenced block is its only class worth keeping: carried past the sanitizer.
    html = html.replace(/<code class="language-([\w+#.-]{1,40})">/g, '<code data-lang="$1">');
    const box = INERT.createElement("div");
    box.innerHTML = html;
    global.DOMPurify.sanitize(box);
    const fragment = document.createDocumentFragment();
    fragment.append(...document.adoptNode(box).childNodes);
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

  function blocksHtml(tokens, links) {
    tokens.links = links;
    return md.parser(tokens);
  }

  /** A streaming reply in `container`: settled blocks, then the growing last one. */
  function stream(container, onDraw) {
    const settled = document.createElement("div");
    const tail = document.createElement("div");
    settled.className = "md-settled";
    tail.className = "md-tail";
    container.append(settled, tail);
    let text = "";
    let offset = 0; // text[0:offset] is rendered in `settled`, for good

    function renderTail() {
      stats.parsed += text.length - offset;
      const tokens = md.lexer(text.slice(offset));
      let last = tokens.length - 1;
      while (last > 0 && tokens[last].type === "space") last -= 1;
      // Every block before the last is complete: a later chunk can only grow the last one.
      const done = last > 0 ? tokens.slice(0, last) : [];
      const growing = tokens.slice(Math.max(last, 0));
      // The finished blocks and the growing one, cleaned in one pass (one parse, one sanitize).
      const both = clean("<div>" + blocksHtml(done, tokens.links) + "</div><div>" + blocksHtml(growing, tokens.links) + "</div>");
      const [finished, grown] = Array.from(both.children);
      if (done.length) {
        // Each redraw's finished blocks in a part of their own, which the browser skips laying out
        // and painting while it is scrolled out of view (app.css, .md-part: content-visibility).
        finished.className = "md-part";
        settled.appendChild(decorate(finished));
        for (const token of done) offset += token.raw.length;
      }
      tail.replaceChildren(...decorate(grown).childNodes);
    }

    // The tail is drawn at most every RENDER_MS, however fast chunks come: a fast model sends
    // hundreds a second, and a reader sees no difference beyond ~10 redraws a second.
    let timer = null;
    let drawn = -Infinity;
    function draw() {
      timer = null;
      drawn = performance.now();
      renderTail();
      if (onDraw) onDraw();
    }

    return {
      append(chunk) {
        text += String(chunk).replace(/\r\n?/g, "\n");
        if (timer === null) timer = setTimeout(draw, Math.max(0, RENDER_MS - (performance.now() - drawn)));
      },
      /** The whole reply: when it is what was streamed only the tail is rendered again. */
      finish(full) {
        clearTimeout(timer);
        timer = null;
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
        renderTail();
      },
      text() { return text; },
    };
  }

  global.ChatrunMarkdown = { render: render, html: html, stream: stream, texts: texts, stats: stats };
})(window);
