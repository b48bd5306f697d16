/* A small Markdown renderer for the bot's replies, safe by construction: it builds DOM nodes
 * and sets only textContent and a checked href, never innerHTML, so a reply's HTML shows as
 * text and cannot run. Written here rather than vendored: a well-known library would need a
 * sanitizer beside it (marked + DOMPurify, ~70 KB) for the few constructs models write:
 * paragraphs, line breaks, headings, lists, quotes, rules, fenced and inline code, bold,
 * italics, strikethrough, links and bare URLs. Links open in a new tab without an opener.
 *
 * ChatrunMarkdown.render(text) -> DocumentFragment */
(function (global) {
  "use strict";

  const SAFE_URL = /^(https?:|mailto:)/i;

  function el(tag, text) {
    const node = document.createElement(tag);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function link(href, text) {
    if (!SAFE_URL.test(href)) return document.createTextNode(text);
    const a = el("a", text);
    a.href = href;
    a.target = "_blank";
    a.rel = "noopener noreferrer";
    return a;
  }

  // Inline syntax, first match wins: code spans, links, bare URLs, bold, italics, strikethrough.
  const INLINE = [
    [/`([^`\n]+)`/, (m) => el("code", m[1])],
    [/\[([^\]\n]+)\]\(([^)\s]+)\)/, (m) => link(m[2], m[1])],
    [/\bhttps?:\/\/[^\s<>()]*[^\s<>().,;:!?'"]/, (m) => link(m[0], m[0])],
    [/\*\*(?=\S)([^\n]*?\S)\*\*|__(?=\S)([^\n]*?\S)__/, (m) => wrap("strong", m[1] || m[2])],
    [/\*(?=\S)([^*\n]*?\S)\*|(?:^|(?<=\W))_(?=\S)([^_\n]*?\S)_(?!\w)/, (m) => wrap("em", m[1] || m[2])],
    [/~~(?=\S)([^\n]*?\S)~~/, (m) => wrap("del", m[1])],
  ];

  function wrap(tag, text) {
    const node = el(tag);
    node.appendChild(inline(text));
    return node;
  }

  /** Inline Markdown of one block's text; single newlines are line breaks. */
  function inline(text) {
    const out = document.createDocumentFragment();
    while (text) {
      let best = null;
      for (const [pattern, make] of INLINE) {
        const m = pattern.exec(text);
        if (m && (!best || m.index < best.m.index)) best = { m: m, make: make };
      }
      if (!best) { addText(out, text); break; }
      addText(out, text.slice(0, best.m.index));
      out.appendChild(best.make(best.m));
      text = text.slice(best.m.index + best.m[0].length);
    }
    return out;
  }

  function addText(out, text) {
    text.split("\n").forEach((line, i) => {
      if (i) out.appendChild(el("br"));
      if (line) out.appendChild(document.createTextNode(line));
    });
  }

  const FENCE = /^\s*(```|~~~)\s*([\w+-]*)\s*$/;
  const HEADING = /^(#{1,6})\s+(.*?)\s*#*\s*$/;
  const BULLET = /^\s*[-*+]\s+(.*)$/;
  const NUMBERED = /^\s*(\d{1,9})[.)]\s+(.*)$/;
  const QUOTE = /^\s*>\s?(.*)$/;
  const RULE = /^\s*([-*_])(\s*\1){2,}\s*$/;

  /** Block structure: code fences first (their insides are text), then one block per kind. */
  function render(source) {
    const out = document.createDocumentFragment();
    const lines = String(source).replace(/\r\n?/g, "\n").split("\n");
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      let m;
      if ((m = FENCE.exec(line))) {
        const body = [];
        for (i += 1; i < lines.length && !new RegExp("^\\s*" + m[1] + "\\s*$").test(lines[i]); i += 1) body.push(lines[i]);
        i += 1; // the closing fence (a reply still streaming may not have it yet)
        const pre = el("pre");
        const code = el("code", body.join("\n"));
        if (m[2]) code.dataset.lang = m[2];
        pre.appendChild(code);
        out.appendChild(pre);
      } else if (!line.trim()) {
        i += 1;
      } else if ((m = HEADING.exec(line))) {
        out.appendChild(wrap("h" + Math.min(6, m[1].length + 2), m[2]));
        i += 1;
      } else if (RULE.test(line)) {
        out.appendChild(el("hr"));
        i += 1;
      } else if (QUOTE.test(line)) {
        const body = [];
        for (; i < lines.length && (m = QUOTE.exec(lines[i])); i += 1) body.push(m[1]);
        const quote = el("blockquote");
        quote.appendChild(render(body.join("\n")));
        out.appendChild(quote);
      } else if (BULLET.test(line) || NUMBERED.test(line)) {
        i = list(lines, i, out);
      } else {
        const body = [];
        for (; i < lines.length && lines[i].trim() && !startsBlock(lines[i]); i += 1) body.push(lines[i]);
        out.appendChild(wrap("p", body.join("\n")));
      }
    }
    return out;
  }

  function startsBlock(line) {
    return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line)
      || BULLET.test(line) || NUMBERED.test(line);
  }

  /** A list: consecutive items of one kind; an indented line continues the item before it. */
  function list(lines, i, out) {
    const numbered = !BULLET.test(lines[i]);
    const pattern = numbered ? NUMBERED : BULLET;
    const node = el(numbered ? "ol" : "ul");
    const first = numbered ? Number(NUMBERED.exec(lines[i])[1]) : 1;
    if (numbered && first !== 1) node.start = first;
    let item = null;
    for (; i < lines.length; i += 1) {
      const m = pattern.exec(lines[i]);
      if (m) {
        item = [numbered ? m[2] : m[1]];
        node.appendChild(el("li"))._lines = item;
      } else if (item && /^\s{2,}\S/.test(lines[i])) {
        item.push(lines[i].trim());
      } else {
        break;
      }
    }
    node.querySelectorAll("li").forEach((li) => li.appendChild(inline(li._lines.join("\n"))));
    out.appendChild(node);
    return i;
  }

  global.ChatrunMarkdown = { render: render };
})(window);
