// The tools panel: the agent's tools with their schemas (GET /v1/tools), each server tool with a
// form to run it by itself on the gateway (POST /v1/tools/{name}/test), its result as a card.

import { $, el, jsonDetails, kvCard, pretty } from "./cards.js";

/**
 * What the panel needs from the page.
 * @typedef {object} PanelHost
 * @property {() => Promise<Record<string, string>>} authHeaders The page's credential, as headers.
 * @property {Map<string, object>} toolInfo Tool name -> ToolInfo; the panel adds what it loads.
 * @property {() => object | null} session The session.created event, once there is one.
 * @property {(tool: object) => object | null} example A prefilled input for a tool, or null.
 * @property {(tool: object) => string | null} tryPrompt A chat prompt that makes the model call it.
 * @property {(prompt: string) => void} tryInChat Put that prompt in the composer.
 */

export class ToolsPanel {
  /** @param {PanelHost} host */
  constructor(host) {
    this._host = host;
    /** the arguments of the last render, to draw again when the agent's info arrives */
    this._drawn = null;
    /** load() calls so far: only the latest one draws */
    this._asked = 0;
    /** GET /v1/tools failed: the session's tool list is shown instead */
    this._fallback = false;
    /**
     * An API key typed into the panel, for the test endpoint: it runs a tool with no user and
     * no confirmation, so it takes a backend's API key, never a page's client token. Kept in
     * memory only (gone with the page): a key never goes to storage.
     */
    this._key = null;
  }

  /** The agent whose tools are shown (null: the gateway's own). */
  get agent() {
    return this._drawn?.[1] ?? null;
  }

  /** The tools of `agent` (the gateway's own when null), with their schemas. */
  async load(agent = null) {
    const asked = ++this._asked;
    try {
      const query = agent ? `?agent=${encodeURIComponent(agent)}` : "";
      const headers = { accept: "application/json", ...(await this._host.authHeaders()) };
      const response = await fetch(`/v1/tools${query}`, { headers });
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      const data = await response.json();
      if (asked !== this._asked) return;
      for (const tool of data.tools ?? []) this._host.toolInfo.set(tool.name, tool);
      this.render(data.tools ?? [], data.agent);
    } catch (err) {
      if (asked !== this._asked) return;
      this._fallback = true;
      $("#tools-status").textContent = `Could not load /v1/tools (${err.message}); showing the session's tools, without schemas.`;
      const session = this._host.session();
      if (session) this.render(session.tools ?? [], session.agent);
    }
  }

  /** A session started: its tools stand in when GET /v1/tools failed. */
  onSession(created) {
    if (this._fallback) this.render(created.tools ?? [], created.agent);
  }

  /** Draw the same tools again (the agent's suggestions arrived: "Try in chat" buttons). */
  redraw() {
    if (this._drawn) this.render(...this._drawn);
  }

  render(tools, agent) {
    this._drawn = [tools, agent];
    $("#tools-agent").textContent = agent ? `agent: ${agent}` : "";
    if (!this._fallback) $("#tools-status").hidden = true;
    $("#tools-list").replaceChildren(...tools.map((tool) => this._card(tool)));
  }

  _card(tool) {
    const badges = el("p", { class: "badges" },
      el("span", { class: `badge ${tool.kind}` }, tool.kind === "client" ? "client · runs in the page" : "server · runs on the gateway"),
      el("span", { class: `badge ${tool.execution === "async" ? "async" : ""}` }, tool.execution || "sync"),
      tool.delivery ? el("span", { class: "badge" }, `delivery: ${tool.delivery}`) : null,
      tool.confirm ? el("span", { class: "badge confirm-badge" }, "asks the user first") : null,
      tool.timeout ? el("span", { class: "badge" }, `timeout ${tool.timeout} s`) : null);
    const card = el("article", { class: "tool", "data-tool": tool.name, "data-kind": tool.kind },
      el("h3", {}, tool.display_name || tool.name, " ", el("code", {}, tool.name)),
      badges,
      tool.description ? el("p", { class: "tool-desc" }, tool.description) : null);
    if (tool.input_schema) {
      card.append(el("details", { class: "tool-schema" }, el("summary", {}, "Input schema"), el("pre", {}, pretty(tool.input_schema))));
    }
    const actions = el("div", { class: "tool-actions" });
    if (tool.kind === "server") {
      const inputId = `tool-input-${tool.name}`;
      const input = el("textarea", { class: "tool-input", id: inputId, rows: 2, spellcheck: "false" });
      input.value = JSON.stringify(this._host.example(tool) ?? exampleInput(tool));
      const run = el("button", { class: "btn btn-primary btn-small tool-run", type: "button" }, "Run on the gateway");
      const output = el("div", { class: "tool-output", "aria-live": "polite", hidden: true });
      run.addEventListener("click", () => this._run(tool.name, input, run, output));
      card.append(el("label", { for: inputId, class: "small" }, "Input (JSON)"), input, actions, output);
      actions.append(run);
    } else {
      card.append(el("p", { class: "tool-note" }, "A client function: it runs in the client (this page), when the model calls it over the WebSocket. Nothing to run on the gateway; try it from the chat."), actions);
    }
    const prompt = this._host.tryPrompt(tool);
    if (prompt) {
      const tryIt = el("button", { class: "btn btn-ghost btn-small tool-try", type: "button" }, `Try in chat: “${prompt}”`);
      tryIt.addEventListener("click", () => this._host.tryInChat(prompt));
      actions.append(tryIt);
    }
    return card;
  }

  /** The credential for running a tool: the key typed in, else the page's own (enough under --no-auth). */
  async _headers() {
    return this._key ? { authorization: `Bearer ${this._key}` } : await this._host.authHeaders();
  }

  /** A 401 from the test endpoint: ask for an API key, then run again with it. */
  _askForKey(data, rerun) {
    const id = `tool-key-${Math.random().toString(36).slice(2)}`;
    const field = el("input", { id, class: "tool-key", type: "password", autocomplete: "off", placeholder: "API key" });
    const use = el("button", { class: "btn btn-small tool-key-use", type: "button" }, "Use this key");
    use.addEventListener("click", () => {
      const key = field.value.trim();
      if (!key) return field.focus();
      this._key = key;
      rerun();
    });
    field.addEventListener("keydown", (e) => { if (e.key === "Enter") use.click(); });
    return el("div", { class: "tool-auth" },
      el("p", { class: "tool-problem" }, `${data?.error ?? "unauthorized"}. Running a tool from here takes an API key (a page's client token may not: it would run the tool with no user and no confirmation). Paste one to try; it stays in this page's memory only.`),
      el("label", { for: id, class: "visually-hidden" }, "API key"),
      el("div", { class: "tool-key-row" }, field, use));
  }

  async _run(name, input, button, output) {
    const show = (ok, heading, body) => {
      output.replaceChildren(el("p", { class: "tool-output-head" }, heading), body);
      output.hidden = false;
      output.removeAttribute("aria-busy");
      output.scrollIntoView({ block: "nearest" }); // the result, not the form, is what was asked for
      output.dataset.ok = String(ok); // set last: tests wait for it
    };
    const problem = (text) => el("p", { class: "tool-problem" }, text);
    let body;
    try {
      body = JSON.parse(input.value.trim() || "{}");
    } catch (err) {
      show(false, "✗ Invalid JSON", problem(err.message));
      return;
    }
    button.disabled = true;
    output.removeAttribute("data-ok");
    output.setAttribute("aria-busy", "true");
    output.hidden = false;
    output.replaceChildren(el("p", { class: "tool-output-head" }, "Running…"));
    const started = performance.now();
    try {
      const query = this.agent ? `?agent=${encodeURIComponent(this.agent)}` : "";
      const response = await fetch(`/v1/tools/${encodeURIComponent(name)}/test${query}`, {
        method: "POST", headers: { "content-type": "application/json", ...(await this._headers()) }, body: JSON.stringify(body),
      });
      let data;
      try { data = await response.json(); } catch { data = { error: `HTTP ${response.status} ${response.statusText}` }; }
      const ms = data?.duration_ms ?? Math.round(performance.now() - started);
      const ok = response.ok && data?.error == null;
      const where = response.ok ? `${ms} ms` : `HTTP ${response.status}`;
      if (ok) show(true, `✓ Output · ${where}`, el("div", {}, kvCard(data.output), jsonDetails(data.output)));
      else if (response.status === 401) {
        this._key = null; // that key (if any) did not do: ask again
        show(false, `✗ Needs an API key · ${where}`, this._askForKey(data, () => this._run(name, input, button, output)));
      } else show(false, `✗ Error · ${where}`, problem(String(data?.error ?? "unknown error")));
    } catch (err) {
      show(false, "✗ Request failed", problem(err.message));
    } finally {
      button.disabled = false;
    }
  }
}

/** An example input built from the schema's required properties (a description's "e.g. 'x'"). */
function exampleInput(tool) {
  const example = {};
  const props = tool.input_schema?.properties ?? {};
  for (const key of tool.input_schema?.required ?? []) {
    const prop = props[key] ?? {};
    const hint = /e\.g\. '([^']+)'/.exec(prop.description ?? "");
    example[key] = prop.type === "integer" || prop.type === "number" ? 0 : prop.type === "boolean" ? false : hint ? hint[1] : "";
  }
  return example;
}
