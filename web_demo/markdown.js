// Markdown for a model's chat replies: a small, pragmatic subset of CommonMark + GFM (headings,
// lists, quotes, fenced code, tables, emphasis, links), rendered like ChatGPT does.
//
// The model is untrusted, so nothing it writes ever becomes markup: parseMarkdown turns the text
// into a plain tree of { tag, attrs, children } nodes and strings, whose tags and attribute
// names come from this file only, and toDom builds DOM from it with createElement /
// createTextNode / setAttribute / append (raw HTML in the text stays text). Links keep only
// http:, https: and mailto: URLs; images become links (no <img>: no tracking pixels).
//
// The demo re-renders a reply on every animation frame while it streams, so partial input
// renders sensibly (an unclosed ``` fence runs to the end, an unclosed ** stays literal) and
// the parser is linear-ish: a block pass (lines -> blocks), then an inline pass per block.

/**
 * A parsed node: a string (text, never HTML) or an element of a fixed set of tags.
 * @typedef {string | { tag: string, attrs?: Record<string, string | number>, children?: MdNode[] }} MdNode
 */

const MAX_DEPTH = 16; // quotes / lists nested deeper than this render as text (stack safety)
const LINK_ATTRS = { rel: "noopener noreferrer nofollow", target: "_blank" };

// ---- Block pass: lines -> blocks ---------------------------------------------------------------

const FENCE = /^(`{3,})([^`]*)$|^(~{3,})(.*)$/; // ``` info may not hold a backtick, ~~~ info may
const HEADING = /^(#{1,6})(?:[ \t]+(.*))?$/;
const HR = /^([-*_])[ \t]*(?:\1[ \t]*){2,}$/;
const LIST = /^([-*+]|(\d{1,9})[.)])(?:([ \t]+)(.*))?$/;
const DELIM_CELL = /^:?-+:?$/;

const isBlank = (line) => !/\S/.test(line);

/** Columns of leading whitespace (a tab advances to the next multiple of 4). */
function indentOf(line) {
  let col = 0;
  for (const ch of line) {
    if (ch === " ") col++;
    else if (ch === "\t") col += 4 - (col % 4);
    else break;
  }
  return col;
}

/** `line` without up to `cols` columns of leading whitespace. */
function dedent(line, cols) {
  let col = 0;
  let i = 0;
  for (; i < line.length && col < cols; i++) {
    if (line[i] === " ") col++;
    else if (line[i] === "\t") col += 4 - (col % 4);
    else break;
  }
  return line.slice(i);
}

/** A list item's marker on `line`, or null. */
function listMarker(line) {
  const m = LIST.exec(line.trimStart());
  if (!m) return null;
  const indent = indentOf(line);
  const spaces = m[3] ? Math.min(m[3].length, 4) : 1;
  return { indent, ordered: m[2] !== undefined, start: m[2] === undefined ? 1 : Number(m[2]),
    content: m[4] ?? "", contentCol: indent + m[1].length + spaces };
}

/** Whether `line` starts a block that ends a paragraph (or a table, or a lazy line). */
function interrupts(line) {
  const rest = line.trimStart();
  if (rest[0] === ">" || FENCE.test(rest) || HEADING.test(rest) || HR.test(rest)) return true;
  // As in CommonMark: a list interrupts a paragraph only with content, an ordered one at 1.
  const item = listMarker(line);
  return item !== null && item.content.trim() !== "" && item.start === 1;
}

/** A GFM table row's cells; `\|` is a pipe inside a cell. */
function splitRow(line) {
  let s = line.trim();
  if (s.startsWith("|")) s = s.slice(1);
  if (s.endsWith("|") && !s.endsWith("\\|")) s = s.slice(0, -1);
  return s.split(/(?<!\\)\|/).map((cell) => cell.trim().replaceAll("\\|", "|"));
}

/** If lines[i] is a table's header row (followed by its delimiter row): the columns' alignments. */
function tableAt(lines, i) {
  const next = lines[i + 1];
  if (next === undefined || !lines[i].includes("|") || !next.includes("|")) return null;
  const delims = splitRow(next);
  if (!delims.every((d) => DELIM_CELL.test(d)) || delims.length !== splitRow(lines[i]).length) return null;
  return delims.map((d) => (d.endsWith(":") ? (d.startsWith(":") ? "center" : "right") : d.startsWith(":") ? "left" : null));
}

/** Parse `lines` into blocks; `spaced`: a blank line separates two of them (a loose list item). */
function blocks(lines, depth) {
  /** @type {MdNode[]} */
  const out = [];
  let spaced = false;
  let blank = false;
  let i = 0;
  if (depth > MAX_DEPTH) return { nodes: [{ tag: "p", children: inline(lines.join("\n").trim()) }], spaced };
  while (i < lines.length) {
    const line = lines[i];
    if (isBlank(line)) { blank = true; i++; continue; }
    if (blank && out.length) spaced = true;
    blank = false;
    const rest = line.trimStart();
    let m;
    if ((m = FENCE.exec(rest))) {
      i = fence(lines, i, m, out);
    } else if ((m = HEADING.exec(rest))) {
      // Closing #s go ("## Title ##"), a # inside a word stays ("# C#").
      const text = (m[2] ?? "").trim().replace(/(^|[ \t]+)#+$/, "").trim();
      out.push({ tag: `h${m[1].length}`, children: inline(text) });
      i++;
    } else if (HR.test(rest)) {
      out.push({ tag: "hr" });
      i++;
    } else if (rest[0] === ">") {
      const inner = [];
      for (; i < lines.length; i++) {
        const r = lines[i].trimStart();
        if (r[0] === ">") inner.push(r.slice(r[1] === " " ? 2 : 1));
        // A lazy line continues the quote's paragraph.
        else if (!isBlank(r) && !isBlank(inner.at(-1)) && !interrupts(r)) inner.push(r);
        else break;
      }
      out.push({ tag: "blockquote", children: blocks(inner, depth + 1).nodes });
    } else if (listMarker(line)) {
      i = list(lines, i, depth, out);
    } else if (tableAt(lines, i)) {
      i = table(lines, i, out);
    } else {
      // A paragraph: its lines up to a blank line or another block; each newline is a <br>.
      const para = [line.trim()];
      for (i++; i < lines.length && !isBlank(lines[i]) && !interrupts(lines[i]) && !tableAt(lines, i); i++) {
        para.push(lines[i].trim());
      }
      out.push({ tag: "p", children: inline(para.join("\n")) });
    }
  }
  return { nodes: out, spaced };
}

/** A fenced code block from lines[i]; one left unclosed (mid-stream) runs to the end. */
function fence(lines, i, m, out) {
  const marker = m[1] ?? m[3];
  const indent = indentOf(lines[i]);
  const lang = (m[2] ?? m[4]).trim().split(/\s+/)[0];
  const code = [];
  for (i++; i < lines.length; i++) {
    const r = lines[i].trim();
    if (r.startsWith(marker) && /^(`+|~+)$/.test(r) && r[0] === marker[0]) { i++; break; }
    code.push(dedent(lines[i], indent));
  }
  const attrs = /^[\w#+.-]{1,40}$/.test(lang) ? { "data-lang": lang } : undefined;
  out.push({ tag: "pre", children: [{ tag: "code", ...(attrs && { attrs }), children: [code.join("\n")] }] });
  return i;
}

/**
 * A list from lines[i]. An item holds the lines after its marker that are indented 2+ columns
 * deeper than the marker (a nested list, more paragraphs, code), blank lines followed by such
 * lines, and lazy continuation lines (unindented text right after a line of the item).
 */
function list(lines, i, depth, out) {
  const first = listMarker(lines[i]);
  const items = [];
  let loose = false;
  while (i < lines.length) {
    const item = listMarker(lines[i]);
    if (!item || item.ordered !== first.ordered) break;
    const body = [item.content];
    let blanks = 0;
    for (i++; i < lines.length; i++) {
      const line = lines[i];
      if (isBlank(line)) { blanks++; continue; }
      if (indentOf(line) >= item.indent + 2) {
        for (; blanks > 0; blanks--) body.push("");
        body.push(dedent(line, item.contentCol));
      } else if (blanks || listMarker(line) || interrupts(line)) {
        break;
      } else {
        body.push(line.trim());
      }
    }
    items.push(blocks(body, depth + 1));
    if (i < lines.length && listMarker(lines[i])?.ordered === first.ordered) {
      if (blanks) loose = true; // a blank line between items: paragraphs in them
    } else {
      i -= blanks; // trailing blank lines are the enclosing block's
      break;
    }
  }
  loose ||= items.some((it) => it.spaced);
  // A tight list shows its items' paragraphs as bare text (ChatGPT does the same).
  const children = items.map(({ nodes }) => ({
    tag: "li",
    children: loose ? nodes : nodes.flatMap((n) => (typeof n === "object" && n.tag === "p" ? n.children : [n])),
  }));
  const start = first.ordered && first.start !== 1 ? { attrs: { start: first.start } } : {};
  out.push({ tag: first.ordered ? "ol" : "ul", ...start, children });
  return i;
}

/** A GFM table from lines[i]: header, delimiter row, then the rows (lines with a pipe). */
function table(lines, i, out) {
  const aligns = tableAt(lines, i);
  const row = (line, tag) => {
    const cells = splitRow(line); // padded / cut to the header's width
    return { tag: "tr", children: aligns.map((align, c) => ({
      tag, ...(align && { attrs: { align } }), children: inline(cells[c] ?? ""),
    })) };
  };
  const table = { tag: "table", children: [{ tag: "thead", children: [row(lines[i], "th")] }] };
  const body = [];
  // GFM would also take a line without a pipe as a row; a model's text after a table is not.
  for (i += 2; i < lines.length && lines[i].includes("|") && !interrupts(lines[i]); i++) body.push(row(lines[i], "td"));
  if (body.length) table.children.push({ tag: "tbody", children: body });
  out.push(table);
  return i;
}

// ---- Inline pass: a small tokenizer, then emphasis matching -------------------------------------

// Where something may start; plain text between is copied in one slice.
const SPECIAL = /[\\`<!\[*_~\n]|\bhttps?:\/\//g;
const ESCAPABLE = /[!-/:-@[-`{-~]/; // ASCII punctuation
const PUNCT = /[\p{P}\p{S}]/u;
const SPACE = /\s/;
const AUTOLINK = /<((?:https?:\/\/|mailto:)[^\s<>]+|[\w.+-]+@[\w-]+(?:\.[\w-]+)+)>/y;
const BARE_URL = /https?:\/\/[^\s<]*/y;
// After "[label]": "(dest)" or "(dest "title")", dest balancing one level of parentheses.
const DEST = /\(\s*(?:<([^<>\n]*)>|((?:\\.|[^\s()\\]|\((?:\\.|[^\s()\\])*\))*))(?:\s+(?:"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|\((?:\\.|[^()\\])*\)))?\s*\)/y;

/** `url` (absolute http:, https: or mailto:) normalised, or null for anything else. */
export function safeHref(url) {
  try {
    const parsed = new URL(url); // no base: relative URLs throw
    return ["http:", "https:", "mailto:"].includes(parsed.protocol) ? parsed.href : null;
  } catch {
    return null;
  }
}

const unescape = (s) => s.replace(/\\([!-/:-@[-`{-~])/g, "$1");

/** A link node, or its label alone when the URL is not allowed. */
function link(url, label) {
  const href = safeHref(url);
  return href ? [{ tag: "a", attrs: { href, ...LINK_ATTRS }, children: label }] : label;
}

/** A `*`, `_` or `~~` run at src[i], with whether it may open / close emphasis (CommonMark). */
function delimiter(src, i, ch, len) {
  const before = src[i - 1] ?? " ";
  const after = src[i + len] ?? " ";
  const space = (c) => SPACE.test(c);
  const punct = (c) => PUNCT.test(c);
  const left = !space(after) && (!punct(after) || space(before) || punct(before));
  const right = !space(before) && (!punct(before) || space(after) || punct(after));
  // `_` only at word boundaries, so snake_case_names stay as they are.
  const open = ch === "_" ? left && (!right || punct(before)) : left;
  const close = ch === "_" ? right && (!left || punct(after)) : right;
  return { delim: true, ch, len, orig: len, open, close };
}

/** Inline nodes of `src`; `noLinks` inside a link's label (links do not nest). */
function inline(src, noLinks = false) {
  const items = []; // strings, nodes and delimiter runs, in order
  let text = "";
  const push = (...nodes) => {
    if (text) items.push(text);
    text = "";
    items.push(...nodes);
  };
  const noCloser = new Set(); // lengths of backtick runs known not to appear further on
  let closers = null; // "[" index -> its "]" index, found once (on the first "[")
  let i = 0;
  while (i < src.length) {
    SPECIAL.lastIndex = i;
    const m = SPECIAL.exec(src);
    if (!m) { text += src.slice(i); break; }
    text += src.slice(i, m.index);
    i = m.index;
    const c = src[i];
    if (c === "\\") {
      if (src[i + 1] === "\n") { push({ tag: "br" }); i += 2; }
      else if (ESCAPABLE.test(src[i + 1] ?? "")) { text += src[i + 1]; i += 2; }
      else { text += c; i++; }
    } else if (c === "\n") {
      push({ tag: "br" });
      i++;
    } else if (c === "`") {
      // A code span ends at the next run of exactly as many backticks; contents verbatim.
      let n = 1;
      while (src[i + n] === "`") n++;
      let end = noCloser.has(n) ? -1 : src.indexOf("`".repeat(n), i + n);
      while (end >= 0 && src[end + n] === "`") {
        let after = end;
        while (src[after] === "`") after++;
        end = src.indexOf("`".repeat(n), after);
      }
      if (end < 0) { noCloser.add(n); text += src.slice(i, i + n); i += n; continue; }
      let code = src.slice(i + n, end).replaceAll("\n", " ");
      if (/^ .*[^ ].* $/s.test(code)) code = code.slice(1, -1);
      push({ tag: "code", children: [code] });
      i = end + n;
    } else if (c === "*" || c === "_" || c === "~") {
      let n = 1;
      while (src[i + n] === c) n++;
      // Only ~~ strikes through: a single ~ means "approximately".
      if (c === "~" && n !== 2) text += src.slice(i, i + n);
      else push(delimiter(src, i, c, n));
      i += n;
    } else if (noLinks) {
      text += c;
      i++;
    } else if (c === "<") {
      AUTOLINK.lastIndex = i;
      const auto = AUTOLINK.exec(src);
      if (auto) {
        const url = auto[1].includes(":") ? auto[1] : `mailto:${auto[1]}`;
        push(...link(url, [auto[1]]));
        i = AUTOLINK.lastIndex;
      } else { text += c; i++; }
    } else if (c === "h") {
      // A bare URL, without trailing punctuation ("see https://x.com." / "(https://x.com)").
      BARE_URL.lastIndex = i;
      let url = BARE_URL.exec(src)[0]; // "https://" alone is no URL: safeHref refuses it
      const unbalanced = (u) => u.endsWith(")") && u.split("(").length < u.split(")").length;
      while (/[.,:;!?'"*_~\]]$/.test(url) || unbalanced(url)) url = url.slice(0, -1);
      push(...link(url, [url]));
      i += url.length;
    } else {
      // [label](url), or ![alt](url): an image becomes a link labelled with its alt text.
      const image = c === "!";
      closers ??= brackets(src);
      const found = linkAt(src, image ? i + 1 : i, closers);
      if (found) {
        const label = inline(found.label, true);
        push(...link(found.url, image && !label.length ? [found.url] : label));
        i = found.end;
      } else { text += c; i++; }
    }
  }
  push();
  return emphasis(items);
}

/** Each "[" of `src` mapped to its matching "]" (brackets nest; escaped ones do not count). */
function brackets(src) {
  const closers = new Map();
  const open = [];
  for (let j = 0; j < src.length; j++) {
    if (src[j] === "\\") j++;
    else if (src[j] === "[") open.push(j);
    else if (src[j] === "]" && open.length) closers.set(open.pop(), j);
  }
  return closers;
}

/** The "[label](dest)" at src[s], or null. */
function linkAt(src, s, closers) {
  const j = closers.get(s);
  if (j === undefined) return null;
  DEST.lastIndex = j + 1;
  const m = DEST.exec(src);
  if (!m) return null;
  return { label: src.slice(s + 1, j), url: unescape(m[1] ?? m[2]), end: DEST.lastIndex };
}

/**
 * Pair the delimiter runs into strong / em / del (CommonMark's "process emphasis", simplified):
 * each closer takes the nearest opener of its kind; runs left unpaired are literal text, so an
 * unclosed `**bold` mid-stream shows as typed.
 */
function emphasis(items) {
  const bottom = new Map(); // per kind of closer: no opener for it lies below this index
  for (let c = 0; c < items.length; c++) {
    const closer = items[c];
    if (!closer.delim || !closer.close) continue;
    const kind = `${closer.ch}${closer.open}${closer.orig % 3}`;
    while (closer.len > 0) {
      let o = c - 1;
      for (; o >= (bottom.get(kind) ?? 0); o--) {
        const op = items[o];
        if (!op.delim || op.ch !== closer.ch || !op.open || op.len === 0) continue;
        // The "rule of 3": in "*a**b*" the ** neither opens nor closes the outer *.
        const both = op.close || closer.open;
        if (both && (op.orig + closer.orig) % 3 === 0 && (op.orig % 3 || closer.orig % 3)) continue;
        break;
      }
      if (o < (bottom.get(kind) ?? 0)) { bottom.set(kind, c); break; }
      const opener = items[o];
      const n = closer.ch === "~" ? 2 : Math.min(2, opener.len, closer.len);
      const tag = closer.ch === "~" ? "del" : n === 2 ? "strong" : "em";
      const inner = items.splice(o + 1, c - o - 1, null);
      items[o + 1] = { tag, children: literal(inner) };
      opener.len -= n;
      closer.len -= n;
      c = o + 2;
      for (const [k, b] of bottom) if (b > o) bottom.set(k, o + 1); // indices above o moved
    }
  }
  return literal(items);
}

/** Unpaired delimiter runs as text, adjacent strings merged. */
function literal(items) {
  const out = [];
  for (const item of items) {
    const node = item?.delim ? item.ch.repeat(item.len) : item;
    if (node === "" || node == null) continue;
    if (typeof node === "string" && typeof out.at(-1) === "string") out[out.length - 1] += node;
    else out.push(node);
  }
  return out;
}

// ---- API ---------------------------------------------------------------------------------------

/**
 * Parse a model's Markdown reply (complete or still streaming) into a tree of nodes.
 * @param {string} text
 * @returns {MdNode[]}
 */
export function parseMarkdown(text) {
  const lines = String(text ?? "").replace(/\r\n?/g, "\n").trim().split("\n");
  return blocks(lines, 0).nodes;
}

const TAGS = new Set(["p", "h1", "h2", "h3", "h4", "h5", "h6", "ul", "ol", "li", "blockquote", "pre",
  "code", "hr", "br", "strong", "em", "del", "a", "table", "thead", "tbody", "tr", "th", "td"]);
const ALIGN = (v) => (["left", "center", "right"].includes(v) ? v : null);
// The only attributes ever set, per tag, each with what it may hold (null: not set).
const ATTRS = {
  a: { href: (v) => safeHref(String(v)), rel: () => LINK_ATTRS.rel, target: () => LINK_ATTRS.target },
  ol: { start: (v) => (/^\d{1,9}$/.test(String(v)) ? String(Number(v)) : null) },
  code: { "data-lang": (v) => (typeof v === "string" ? v : null) },
  th: { align: ALIGN },
  td: { align: ALIGN },
};

/**
 * Build DOM from parsed nodes with createElement / createTextNode / setAttribute / append only.
 * An unknown tag (or a link whose href is not allowed) renders its children alone.
 * @param {MdNode[]} nodes
 * @param {Document} [doc]
 * @returns {DocumentFragment}
 */
export function toDom(nodes, doc = globalThis.document) {
  const fragment = doc.createDocumentFragment();
  // A loop rather than recursion: "*a *a *a … a* a* a*" nests as deep as the text is long.
  const todo = [[fragment, nodes]];
  while (todo.length) {
    const [parent, children] = todo.pop();
    for (const node of children ?? []) {
      if (typeof node === "string") {
        parent.append(doc.createTextNode(node));
      } else if (!TAGS.has(node?.tag) || (node.tag === "a" && !safeHref(String(node.attrs?.href)))) {
        parent.append(toDom(node?.children, doc));
      } else {
        const element = doc.createElement(node.tag);
        for (const [name, check] of Object.entries(ATTRS[node.tag] ?? {})) {
          const value = check(node.attrs?.[name]);
          if (value != null) element.setAttribute(name, value);
        }
        parent.append(element);
        todo.push([element, node.children]);
      }
    }
  }
  return fragment;
}

/**
 * Render a model's Markdown reply as a DocumentFragment (safe: no HTML from the text).
 * @param {string} text
 * @param {Document} [doc]
 * @returns {DocumentFragment}
 */
export function renderMarkdown(text, doc = globalThis.document) {
  return toDom(parseMarkdown(text), doc);
}
