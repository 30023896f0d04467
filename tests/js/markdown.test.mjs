// Tests of web_demo/markdown.js, the renderer of a model's Markdown replies in the web demo:
// the parsed tree for each construct, safety (HTML stays text, only http/https/mailto links),
// streaming (partial input renders sensibly), and toDom building DOM only through a fake
// document's createElement / createTextNode / setAttribute / append.
// Run: node --test tests/js/markdown.test.js

import { test } from "node:test";
import assert from "node:assert/strict";
import { parseMarkdown, renderMarkdown, toDom } from "../../web_demo/markdown.js";

const md = parseMarkdown;
const p = (...children) => ({ tag: "p", children });
const br = { tag: "br" };
const el = (tag, ...children) => ({ tag, children });
const LINK = { rel: "noopener noreferrer nofollow", target: "_blank" };
const a = (href, ...children) => ({ tag: "a", attrs: { href, ...LINK }, children });

/** Every node of a tree, depth first. */
function* walk(nodes) {
  for (const node of nodes) {
    yield node;
    if (typeof node === "object") yield* walk(node.children ?? []);
  }
}
const tags = (nodes) => [...walk(nodes)].filter((n) => typeof n === "object").map((n) => n.tag);
const texts = (nodes) => [...walk(nodes)].filter((n) => typeof n === "string").join("");

test("paragraphs, line breaks, surrounding whitespace and Windows newlines", () => {
  assert.deepEqual(md("\n\n  one\ntwo  \r\nthree\r\n\r\nfour\n\n"), [p("one", br, "two", br, "three"), p("four")]);
  assert.deepEqual(md("end\\\nnext"), [p("end", br, "next")]); // a backslash hard break
  assert.deepEqual(md(""), []);
  assert.deepEqual(md("   \n \n"), []);
});

test("ATX headings and thematic breaks", () => {
  assert.deepEqual(md("# One\n## Two ##\n### C#\n###### Six\n####### seven\n#hashtag"), [
    el("h1", "One"), el("h2", "Two"), el("h3", "C#"), el("h6", "Six"), p("####### seven", br, "#hashtag"),
  ]);
  assert.deepEqual(md("a\n\n---\n***\n___\n* * *\nb"), [p("a"), { tag: "hr" }, { tag: "hr" }, { tag: "hr" }, { tag: "hr" }, p("b")]);
  assert.deepEqual(md("## **Bold** title"), [el("h2", el("strong", "Bold"), " title")]);
});

test("fenced code: language, verbatim contents, ~~~, longer fences", () => {
  const code = "if a < b and c:\n    print('<b>**not bold**</b>')\n\n# not a heading";
  assert.deepEqual(md("Run:\n```python\n" + code + "\n```\nafter"), [
    p("Run:"),
    { tag: "pre", children: [{ tag: "code", attrs: { "data-lang": "python" }, children: [code] }] },
    p("after"),
  ]);
  assert.deepEqual(md("~~~\n```\nx\n~~~"), [{ tag: "pre", children: [el("code", "```\nx")] }]);
  assert.deepEqual(md("````md\n```js\ny\n```\n````"), [
    { tag: "pre", children: [{ tag: "code", attrs: { "data-lang": "md" }, children: ["```js\ny\n```"] }] },
  ]);
  assert.deepEqual(md("```\n\n```"), [{ tag: "pre", children: [el("code", "")] }]);
});

test("an unclosed fence (mid-stream) runs to the end of the text", () => {
  assert.deepEqual(md("Here:\n```js\nconst x = 1;\n\nconst y = `**`;"), [
    p("Here:"),
    { tag: "pre", children: [{ tag: "code", attrs: { "data-lang": "js" }, children: ["const x = 1;\n\nconst y = `**`;"] }] },
  ]);
  assert.deepEqual(md("```"), [{ tag: "pre", children: [el("code", "")] }]);
});

test("unordered lists: markers, inline content, lazy lines, interrupting a paragraph", () => {
  assert.deepEqual(md("Items:\n- **one**\n* two\ncontinued\n+ three"), [
    p("Items:"),
    el("ul", el("li", el("strong", "one")), el("li", "two", br, "continued"), el("li", "three")),
  ]);
  // Not list items: emphasis at the start of a line, a number in text.
  assert.deepEqual(tags(md("**Note:** x\n*em* y\n-5 degrees")), ["p", "strong", "br", "em", "br"]);
});

test("nested lists by indentation", () => {
  assert.deepEqual(md("- a\n  - b\n    - c\n  - d\n- e"), [
    el("ul",
      el("li", "a", el("ul", el("li", "b", el("ul", el("li", "c"))), el("li", "d"))),
      el("li", "e")),
  ]);
  // Under "1." a nested list 2 or 3 columns in both nest.
  const nested = [el("ol", el("li", "a", el("ul", el("li", "b"))), el("li", "c"))];
  assert.deepEqual(md("1. a\n  - b\n2. c"), nested);
  assert.deepEqual(md("1. a\n   - b\n2. c"), nested);
  // One space deeper is a sibling, not a child.
  assert.deepEqual(md("- a\n - b"), [el("ul", el("li", "a"), el("li", "b"))]);
});

test("ordered lists: start, ) delimiter, blank lines between items make one (loose) list", () => {
  assert.deepEqual(md("1. one\n2. two"), [el("ol", el("li", "one"), el("li", "two"))]);
  assert.deepEqual(md("3) three\n4) four"), [{ tag: "ol", attrs: { start: 3 }, children: [el("li", "three"), el("li", "four")] }]);
  assert.deepEqual(md("1. one\n\n2. two\n\n3. three"), [
    el("ol", el("li", p("one")), el("li", p("two")), el("li", p("three"))),
  ]);
  // A number other than 1 does not interrupt a paragraph ("... in\n2024. we ...").
  assert.deepEqual(md("Founded in\n2024. Then"), [p("Founded in", br, "2024. Then")]);
});

test("list items hold paragraphs and code; trailing text after a blank line leaves the list", () => {
  assert.deepEqual(md("- a\n\n  more a\n- b\n\nafter"), [
    el("ul", el("li", p("a"), p("more a")), el("li", p("b"))),
    p("after"),
  ]);
  assert.deepEqual(md("1. Install:\n   ```sh\n   pip install x\n   ```\n2. Run"), [
    el("ol",
      el("li", "Install:", { tag: "pre", children: [{ tag: "code", attrs: { "data-lang": "sh" }, children: ["pip install x"] }] }),
      el("li", "Run")),
  ]);
});

test("blockquotes hold blocks, and take lazy lines", () => {
  assert.deepEqual(md("> # Title\n> - a\n> - b\n>\n> text\nlazy\n\nout"), [
    el("blockquote", el("h1", "Title"), el("ul", el("li", "a"), el("li", "b")), p("text", br, "lazy")),
    p("out"),
  ]);
  assert.deepEqual(md(">> deep"), [el("blockquote", el("blockquote", p("deep")))]);
});

test("GFM tables with alignment, inline cells and escaped pipes", () => {
  const tree = md("Compare:\n| Name | Qty | Note |\n|:-----|:---:|-----:|\n| **a** | 1 | x \\| y |\n| `b\\|c` | 2 |\n\nafter");
  const th = (align, ...children) => ({ tag: "th", ...(align && { attrs: { align } }), children });
  const td = (align, ...children) => ({ tag: "td", ...(align && { attrs: { align } }), children });
  assert.deepEqual(tree, [
    p("Compare:"),
    el("table",
      el("thead", el("tr", th("left", "Name"), th("center", "Qty"), th("right", "Note"))),
      el("tbody",
        el("tr", td("left", el("strong", "a")), td("center", "1"), td("right", "x | y")),
        el("tr", td("left", el("code", "b|c")), td("center", "2"), td("right")))),
    p("after"),
  ]);
  // No alignment: no attrs.
  assert.deepEqual(md("a | b\n--|--"), [el("table", el("thead", el("tr", el("th", "a"), el("th", "b"))))]);
});

test("a table whose delimiter row has not arrived yet renders as a paragraph", () => {
  assert.deepEqual(tags(md("| a | b |")), ["p"]);
  assert.deepEqual(tags(md("| a | b |\n|---")), ["p", "br"]); // one cell of two so far
  assert.equal(tags(md("| a | b |\n|---|---|"))[0], "table");
});

test("inline: code spans, strong, em, del, escapes", () => {
  assert.deepEqual(md("**b** __b__ *e* _e_ ~~d~~ `**c**` `` a`b `` ***x***"), [p(
    el("strong", "b"), " ", el("strong", "b"), " ", el("em", "e"), " ", el("em", "e"), " ", el("del", "d"), " ",
    el("code", "**c**"), " ", el("code", "a`b"), " ", el("em", el("strong", "x")),
  )]);
  assert.deepEqual(md("*a **b** c*"), [p(el("em", "a ", el("strong", "b"), " c"))]);
  assert.deepEqual(md("\\*not em\\* \\`x\\` \\[y] \\\\ \\a"), [p("*not em* `x` [y] \\ \\a")]);
  assert.deepEqual(md("~5 min, ~~gone~~ ~~~x~~~"), [p("~5 min, ", el("del", "gone"), " ~~~x~~~")]);
});

test("snake_case and intraword underscores are not emphasis", () => {
  assert.deepEqual(md("use snake_case_name, file_name.py, MAX_LEN_ or _private"), [
    p("use snake_case_name, file_name.py, MAX_LEN_ or _private"),
  ]);
  assert.deepEqual(md("call my_func_(x_y) on _this_"), [p("call my_func_(x_y) on ", el("em", "this"))]);
  assert.deepEqual(md("a*b*c"), [p("a", el("em", "b"), "c")]); // * works inside words, as in CommonMark
});

test("unclosed emphasis (mid-stream) stays literal", () => {
  assert.deepEqual(md("This is **bold"), [p("This is **bold")]);
  assert.deepEqual(md("an *em and `code"), [p("an *em and `code")]);
  assert.deepEqual(md("**done** and **not"), [p(el("strong", "done"), " and **not")]);
  assert.deepEqual(md("~~strike"), [p("~~strike")]);
});

test("links, autolinks and bare URLs", () => {
  assert.deepEqual(md("[docs](https://ex.com/a_(b)?q=1 \"title\") and [**mail**](mailto:me@ex.com)"), [p(
    a("https://ex.com/a_(b)?q=1", "docs"), " and ", a("mailto:me@ex.com", el("strong", "mail")),
  )]);
  assert.deepEqual(md("<https://ex.com/x> <me@ex.com>"), [p(
    a("https://ex.com/x", "https://ex.com/x"), " ", a("mailto:me@ex.com", "me@ex.com"),
  )]);
  // Trailing punctuation and an unbalanced ")" are not part of a bare URL.
  assert.deepEqual(md("See https://ex.com/a_b_c. (or http://ex.org/p), fine"), [p(
    "See ", a("https://ex.com/a_b_c", "https://ex.com/a_b_c"), ". (or ", a("http://ex.org/p", "http://ex.org/p"), "), fine",
  )]);
  assert.deepEqual(md("*see https://ex.com*"), [p(el("em", "see ", a("https://ex.com/", "https://ex.com")))]);
  // A link label holds no link; a half-streamed link is text (its URL autolinked).
  assert.deepEqual(md("[https://a.com](https://b.com)"), [p(a("https://b.com/", "https://a.com"))]);
  assert.deepEqual(md("[label](https://ex"), [p("[label](", a("https://ex/", "https://ex"))]);
  assert.deepEqual(md("[not a link] [x]"), [p("[not a link] [x]")]);
});

test("images become links labelled with the alt text (no <img>)", () => {
  assert.deepEqual(md("![a chart](https://ex.com/c.png) ![](https://ex.com/p.gif)"), [p(
    a("https://ex.com/c.png", "a chart"), " ", a("https://ex.com/p.gif", "https://ex.com/p.gif"),
  )]);
  assert.deepEqual(md("![x](javascript:alert(1))"), [p("x")]);
});

test("javascript:, data:, relative and other URLs are refused: the label as text", () => {
  for (const url of ["javascript:alert(1)", "JavaScript:alert(1)", " java\tscript:alert(1)", "data:text/html,<script>x</script>",
    "vbscript:x", "/relative", "relative.html", "//ex.com/x", "file:///etc/passwd", "#top"]) {
    const tree = md(`[label](${url.includes(" ") ? `<${url}>` : url}) after`);
    assert.ok(!tags(tree).includes("a"), `${url} made a link: ${JSON.stringify(tree)}`);
    assert.match(texts(tree), /^label/);
  }
  assert.ok(!tags(md("<javascript:alert(1)>")).includes("a"));
});

test("raw HTML stays text", () => {
  const html = "<script>alert(1)</script> <img src=x onerror=alert(1)> <b>b</b> <a href=\"javascript:x\">y</a>";
  assert.deepEqual(md(html), [p(html)]);
  assert.deepEqual(md("<div>\n\n**x**\n\n</div>"), [p("<div>"), p(el("strong", "x")), p("</div>")]);
});

test("pathological input stays fast and does not blow the stack", () => {
  for (const text of ["[".repeat(20000), "a* ".repeat(5000), "*a ".repeat(3000) + "b* ".repeat(3000),
    "> ".repeat(5000) + "x", "- ".repeat(5000) + "x", "` `` ``` ".repeat(2000), "_a _".repeat(5000)]) {
    const start = performance.now();
    const tree = md(text);
    assert.ok(tree.length > 0);
    assert.ok(performance.now() - start < 1000, `too slow on ${JSON.stringify(text.slice(0, 20))}`);
  }
});

test("a 10 KB mixed reply parses (time printed)", () => {
  const chunk = "## Section\n\nSome **bold** text with *emphasis*, `code`, a [link](https://ex.com/x) and"
    + " https://ex.org/p.\nA line with snake_case_names and ~~old~~ stuff.\n\n- item one\n- item **two**\n"
    + "  - nested *a*\n  - nested b\n1. first\n2. second\n\n> quote with _em_\n\n| a | b |\n|:--|--:|\n"
    + "| 1 | `x` |\n\n```python\ndef f(x):\n    return x * 2\n```\n\n";
  const text = chunk.repeat(Math.ceil(10240 / chunk.length));
  const sections = text.split("## Section").length - 1;
  for (let k = 0; k < 10; k++) md(text); // warm up, as the demo's re-renders are
  const runs = 50;
  const start = performance.now();
  let tree;
  for (let k = 0; k < runs; k++) tree = md(text);
  console.log(`parseMarkdown: ${text.length} chars in ${((performance.now() - start) / runs).toFixed(2)} ms`);
  const count = (tag) => tags(tree).filter((t) => t === tag).length;
  assert.equal(count("h2"), sections);
  assert.equal(count("table"), sections);
  assert.equal(count("pre"), sections);
  assert.equal(count("blockquote"), sections);
});

test("every prefix of a streamed reply parses (what the demo renders each frame)", () => {
  const reply = "# Plan\n\n1. **Read** the `config`:\n   ```yaml\n   key: v\n   ```\n2. Check [docs](https://ex.com).\n\n"
    + "| a | b |\n|---|:-:|\n| 1 | 2 |\n\n> Done ~~now~~ _soon_.";
  for (let n = 0; n <= reply.length; n++) assert.ok(Array.isArray(md(reply.slice(0, n))));
  assert.deepEqual(tags(md(reply)), ["h1", "ol", "li", "strong", "code", "pre", "code", "li", "a",
    "table", "thead", "tr", "th", "th", "tbody", "tr", "td", "td", "blockquote", "p", "del", "em"]);
});

// ---- toDom / renderMarkdown with a fake document ----------------------------------------------

/** A fake document whose nodes record what was built, and throw on any HTML-parsing property. */
function fakeDoc() {
  const calls = [];
  const forbidden = ["innerHTML", "outerHTML", "insertAdjacentHTML", "write"];
  const guard = (target) => new Proxy(target, {
    set(obj, key, value) {
      if (forbidden.includes(key)) throw new Error(`set ${String(key)}`);
      obj[key] = value;
      return true;
    },
    get(obj, key) {
      if (forbidden.includes(key)) throw new Error(`read ${String(key)}`);
      return obj[key];
    },
  });
  const node = (fields) => guard({
    ...fields,
    children: [],
    append(...kids) {
      calls.push("append");
      for (const kid of kids) {
        // Appending a fragment moves its children, as in the DOM.
        if (kid.fragment) this.children.push(...kid.children.splice(0));
        else this.children.push(kid);
      }
    },
  });
  const doc = guard({
    createElement(tag) {
      calls.push(`createElement:${tag}`);
      const element = node({ tag, attrs: {} });
      element.setAttribute = (name, value) => { calls.push(`setAttribute:${name}`); element.attrs[name] = String(value); };
      return element;
    },
    createTextNode(text) { calls.push("createTextNode"); return guard({ text }); },
    createDocumentFragment() { calls.push("createDocumentFragment"); return node({ fragment: true }); },
  });
  return { doc, calls };
}

/** A fake DOM node back as a plain tree, for comparison. */
const plain = (n) => ("text" in n ? n.text : { tag: n.tag, attrs: n.attrs, children: n.children.map(plain) });

test("renderMarkdown builds the tree with createElement / createTextNode / setAttribute / append", () => {
  const { doc, calls } = fakeDoc();
  const fragment = renderMarkdown("# Hi\n\n- [x](https://ex.com) <b>\n\n```py\nprint(1)\n```\n\n3. c", doc);
  assert.ok(fragment.fragment);
  assert.deepEqual(fragment.children.map(plain), [
    { tag: "h1", attrs: {}, children: ["Hi"] },
    { tag: "ul", attrs: {}, children: [{ tag: "li", attrs: {}, children: [
      { tag: "a", attrs: { href: "https://ex.com/", ...LINK }, children: ["x"] }, " <b>"] }] },
    { tag: "pre", attrs: {}, children: [{ tag: "code", attrs: { "data-lang": "py" }, children: ["print(1)"] }] },
    { tag: "ol", attrs: { start: "3" }, children: [{ tag: "li", attrs: {}, children: ["c"] }] },
  ]);
  const used = new Set(calls.map((c) => c.split(":")[0]));
  assert.deepEqual([...used].sort(), ["append", "createDocumentFragment", "createElement", "createTextNode", "setAttribute"]);
});

test("toDom sets only its own attributes, and drops unknown tags and unsafe links", () => {
  const { doc, calls } = fakeDoc();
  const fragment = toDom([
    { tag: "script", children: ["alert(1)"] },
    { tag: "a", attrs: { href: "javascript:alert(1)", onclick: "x" }, children: ["bad"] },
    { tag: "p", attrs: { onclick: "x", style: "y", class: "z" }, children: ["ok"] },
    { tag: "td", attrs: { align: "left\" onmouseover=\"x" }, children: [] },
    { tag: "code", attrs: { "data-lang": "<b>" }, children: ["c"] },
  ], doc);
  assert.deepEqual(fragment.children.map(plain), [
    "alert(1)", "bad",
    { tag: "p", attrs: {}, children: ["ok"] },
    { tag: "td", attrs: {}, children: [] },
    { tag: "code", attrs: { "data-lang": "<b>" }, children: ["c"] },
  ]);
  assert.ok(!calls.includes("createElement:script") && !calls.includes("createElement:a"));
});

test("deeply nested emphasis renders without blowing the stack", () => {
  const { doc } = fakeDoc();
  const depth = 5000; // ~25 KB
  let node = renderMarkdown("*a ".repeat(depth) + "b*".repeat(depth), doc).children[0];
  let levels = 0;
  while (node.children?.some((c) => c.tag === "em")) { node = node.children.find((c) => c.tag === "em"); levels++; }
  assert.ok(levels > 1000, `only ${levels} levels`);
});

test("the fake document really throws on innerHTML (the guard works)", () => {
  const { doc } = fakeDoc();
  assert.throws(() => { doc.createElement("p").innerHTML = "<b>x</b>"; }, /innerHTML/);
  assert.throws(() => { doc.createDocumentFragment().outerHTML = "x"; }, /outerHTML/);
});
