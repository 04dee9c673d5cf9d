// The queue page: send one streaming chat request, show its place in line while it waits
// (position, people ahead, a counting-down ETA, a progress bar), then stream the answer and
// say which backend answered and why. Cancel aborts the fetch: the gateway sees the
// disconnect and the ticket leaves the queue at once. Text from the network is only ever
// set as text (textContent, text nodes), never parsed as HTML. With auth on, the key a
// person enters (key.js) goes with every request as `Authorization: Bearer`.

import { askForKey, keyAccepted, keyForm, withKey } from "./key.js";
import { SSEParser } from "./sse.js";

const $ = (id) => document.getElementById(id);
const ui = {
  form: $("ask"), model: $("model"), prompt: $("prompt"), send: $("send"), stop: $("stop"),
  queue: $("queue"), live: $("queue-live"), position: $("queue-position"),
  ahead: $("queue-ahead"), eta: $("queue-eta"), pool: $("queue-pool"),
  progress: $("queue-progress"), bar: $("queue-bar"), cancel: $("cancel"),
  result: $("result"), route: $("route"), answer: $("answer"), status: $("status"),
  error: $("error"),
};
const MODEL_KEY = "slotgate.model";
const TICK_MS = 250;

let current = null; // the request in flight, if any

// ---- helpers ------------------------------------------------------------------------

function formatSeconds(s) {
  if (s < 1) return "under a second";
  if (s < 60) return `${Math.round(s)} s`;
  const m = Math.floor(s / 60);
  const rest = Math.round(s - m * 60);
  return rest ? `${m} min ${rest} s` : `${m} min`;
}

function explainReason(reason) {
  if (!reason) return "";
  if (reason === "primary") return "the route's primary backend had room";
  if (reason === "overflow" || reason === "fallback:overflow") {
    return "the primary's queue was full, so it overflowed to a fallback";
  }
  const parts = reason.split(":");
  if (parts[0] === "fallback") {
    const [, kind, intent, p] = parts;
    const sure = Number(p);
    const confidence = Number.isFinite(sure) ? `, ${Math.round(sure * 100)}% sure` : "";
    return `moved to the smaller model: a ${kind || "simple"} request` +
      (intent ? ` (${intent}${confidence})` : "");
  }
  return "";
}

function showError(message) {
  ui.error.textContent = message;
  ui.error.hidden = false;
}

function clearError() {
  ui.error.textContent = "";
  ui.error.hidden = true;
}

async function errorMessage(res) {
  // OpenAI-shaped JSON errors carry a message; anything else is summarised, never rendered
  let message = `The gateway answered ${res.status} ${res.statusText}`.trim() + ".";
  if ((res.headers.get("content-type") || "").includes("json")) {
    try {
      const body = await res.json();
      if (body && body.error && typeof body.error.message === "string") {
        message = body.error.message;
      }
    } catch { /* keep the summary */ }
  }
  const retry = Number(res.headers.get("retry-after"));
  if (res.status === 429 || res.status === 503) {
    if (Number.isFinite(retry) && retry > 0) message += ` Try again in ${formatSeconds(retry)}.`;
  }
  return message;
}

// ---- the models -------------------------------------------------------------------------

async function loadModels() {
  try {
    const res = await fetch("/v1/models", { headers: withKey({ Accept: "application/json" }) });
    if (res.status === 401) {
      ui.model.replaceChildren(new Option("Enter an API key", ""));
      showError("This gateway needs an API key: enter it at the top of the page.");
      askForKey();
      return;
    }
    if (!res.ok) throw new Error(await errorMessage(res));
    keyAccepted();
    const body = await res.json();
    const ids = (body.data || []).map((m) => m && m.id).filter((id) => typeof id === "string");
    if (ids.length === 0) {
      ui.model.replaceChildren(new Option("No models configured", ""));
      return;
    }
    ui.model.replaceChildren(...ids.map((id) => new Option(id, id)));
    let saved = null;
    try { saved = localStorage.getItem(MODEL_KEY); } catch { /* storage disabled */ }
    if (saved && ids.includes(saved)) ui.model.value = saved;
  } catch (err) {
    ui.model.replaceChildren(new Option("Models unavailable", ""));
    showError(`Could not load the list of models: ${err.message}`);
  }
}

// ---- one request ---------------------------------------------------------------------------

class Run {
  constructor() {
    this.controller = new AbortController();
    this.queue = null; // {initial, position, ahead, eta, at, shown, pool}
    this.timer = 0;
    this.queueEvents = false; // the gateway sends event: queue_status (else: comments)
    this.started = false;
    this.done = false;
    this.failed = false;
    this.text = null;
    this.headerBackend = null; // x-slotgate-* response headers: the route when the stream began
    this.headerReason = null;
    this.t0 = performance.now();
  }

  // -- the queue panel
  updateQueue(position, ahead, eta, pool) {
    if (!Number.isFinite(position) || position < 1) return;
    const q = this.queue;
    const moved = q === null || q.position !== position;
    // A fair queue (or a higher class lining up) may move us back: say so, bar and all.
    const back = q !== null && position > q.position;
    if (q === null) {
      this.queue = { initial: position, shown: 0 };
    }
    const s = this.queue;
    s.initial = Math.max(s.initial, position);
    if (back) s.shown = 0;
    s.position = position;
    s.ahead = Number.isFinite(ahead) ? ahead : position - 1;
    s.eta = Number.isFinite(eta) && eta >= 0 ? eta : null;
    s.at = performance.now();
    if (pool) s.pool = pool;
    ui.queue.hidden = false;
    ui.send.textContent = "Waiting…";
    ui.position.textContent = String(position);
    ui.ahead.textContent = String(s.ahead);
    ui.pool.textContent = s.pool ? `queue: ${s.pool}` : "";
    if (moved) {
      const people = s.ahead === 1 ? "1 person" : `${s.ahead} people`;
      ui.live.textContent = (back ? "Moved back: a request went ahead of you. " : "") +
        `You are number ${position} in line; ${people} ahead of you.` +
        (s.eta !== null ? ` Estimated wait ${formatSeconds(s.eta)}.` : "");
    }
    this.tick();
    if (!this.timer) this.timer = setInterval(() => this.tick(), TICK_MS);
  }

  tick() {
    const s = this.queue;
    if (s === null) return;
    const elapsed = (performance.now() - s.at) / 1000;
    if (s.eta === null) {
      ui.eta.textContent = "estimating…";
    } else {
      const left = Math.max(0, s.eta - elapsed);
      ui.eta.textContent = left >= 0.5 ? `about ${formatSeconds(left)}` : "any moment now";
    }
    // 1 - position / initial position, moved along towards the next step by the ETA (a step
    // takes about eta / position), never all the way: only the gateway says we moved up
    const step = 1 / s.initial;
    let progress = 1 - s.position / s.initial;
    if (s.eta !== null && s.eta > 0) {
      const perStep = s.eta / s.position;
      progress += step * Math.min(0.9, elapsed / perStep);
    }
    this.setProgress(progress);
  }

  setProgress(value) {
    const s = this.queue;
    const shown = Math.max(s ? s.shown : 0, Math.min(1, Math.max(0, value)));
    if (s) s.shown = shown;
    ui.bar.style.width = `${(shown * 100).toFixed(1)}%`;
    ui.progress.setAttribute("aria-valuenow", String(Math.round(shown * 100)));
  }

  leaveQueue() {
    if (this.timer) clearInterval(this.timer);
    this.timer = 0;
    ui.queue.hidden = true;
    ui.live.textContent = "";
  }

  // -- the answer
  showStart(backend, reason, waitMs) {
    if (this.started) return;
    this.started = true;
    if (this.queue !== null) this.setProgress(1);
    this.leaveQueue();
    ui.result.hidden = false;
    ui.stop.hidden = false;
    this.showRoute(backend, reason, waitMs);
    ui.status.textContent = "Answering…";
    ui.send.textContent = "Answering…";
  }

  showRoute(backend, reason, waitMs) {
    const parts = [];
    if (backend) {
      const who = document.createElement("span");
      const name = document.createElement("strong");
      name.className = "backend";
      name.textContent = backend;
      who.append("Answered by ", name);
      parts.push(who);
    }
    if (reason) {
      const why = document.createElement("span");
      const code = document.createElement("code");
      code.className = "reason";
      code.textContent = reason;
      why.append("Reason ", code);
      const explained = explainReason(reason);
      if (explained) why.append(` — ${explained}`);
      parts.push(why);
    }
    if (Number.isFinite(waitMs) && waitMs > 0) {
      const wait = document.createElement("span");
      wait.textContent = `Waited ${(waitMs / 1000).toFixed(1)} s in the queue`;
      parts.push(wait);
    }
    if (parts.length) ui.route.replaceChildren(...parts);
  }

  append(content) {
    if (!this.started) this.showStart(this.headerBackend, this.headerReason, NaN);
    if (this.text === null) {
      this.text = document.createTextNode("");
      ui.answer.append(this.text);
    }
    this.text.appendData(content);
  }

  fail(message) {
    this.failed = true;
    this.leaveQueue();
    showError(message);
  }

  // -- the stream
  handle(ev) {
    if (this.done || this.failed) return;
    if (ev.event === "queue_status") {
      const s = parseJSON(ev.data);
      if (s) {
        this.queueEvents = true;
        this.updateQueue(Number(s.position), Number(s.ahead), Number(s.eta_s), s.pool);
      }
    } else if (ev.event === "start") {
      const s = parseJSON(ev.data) || {};
      this.showStart(s.backend, s.reason, Number(s.queue_wait_ms));
    } else if (ev.data === "[DONE]") {
      this.done = true;
    } else if (ev.data) {
      const obj = parseJSON(ev.data);
      if (obj && obj.error) {
        const msg = typeof obj.error.message === "string" ? obj.error.message : "Unknown error.";
        this.fail(msg);
      } else if (obj && Array.isArray(obj.choices) && obj.choices.length) {
        const choice = obj.choices[0];
        const content = choice.delta ? choice.delta.content : choice.text;
        if (typeof content === "string" && content) this.append(content);
      }
    }
    if (!this.queueEvents) this.legacyComments(ev.comments);
  }

  // Without queue events a gateway still says `: queue position=N ahead=M eta_s=S` (or the
  // older `: queued position=N`) and `: slot granted backend=B reason=R queue_wait_ms=W`
  legacyComments(comments) {
    for (const c of comments) {
      let m = /^queued? position=(\d+)(?: ahead=(\d+))?(?: eta_s=([\d.]+))?/.exec(c);
      if (m && !this.started) {
        this.updateQueue(Number(m[1]), m[2] ? Number(m[2]) : NaN, m[3] ? Number(m[3]) : NaN, null);
      }
      m = /^slot granted backend=(\S+) reason=(\S*) queue_wait_ms=(\d+)/.exec(c);
      if (m) this.showStart(m[1], m[2], Number(m[3]));
    }
  }
}

function parseJSON(text) {
  try { return JSON.parse(text); } catch { return null; }
}

async function send(event) {
  event.preventDefault();
  if (current !== null) return;
  const prompt = ui.prompt.value.trim();
  const model = ui.model.value;
  clearError();
  if (!model) { showError("Choose a model first."); ui.model.focus(); return; }
  if (!prompt) { showError("Type a prompt first."); ui.prompt.focus(); return; }
  try { localStorage.setItem(MODEL_KEY, model); } catch { /* storage disabled */ }

  const run = new Run();
  current = run;
  ui.send.disabled = true;
  ui.send.textContent = "Sending…";
  ui.result.hidden = true;
  ui.route.replaceChildren();
  ui.answer.replaceChildren();
  ui.answer.setAttribute("aria-busy", "true");
  ui.status.textContent = "";
  try {
    const res = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: withKey({
        "Content-Type": "application/json",
        Accept: "text/event-stream",
        "X-Slotgate-Queue-Events": "true",
      }),
      body: JSON.stringify({ model, stream: true, messages: [{ role: "user", content: prompt }] }),
      signal: run.controller.signal,
    });
    if (!res.ok) {
      run.fail(await errorMessage(res));
      if (res.status === 401) askForKey();
      return;
    }
    if (!res.body) {
      run.fail("This browser cannot read streamed answers.");
      return;
    }
    run.headerBackend = res.headers.get("x-slotgate-backend");
    run.headerReason = res.headers.get("x-slotgate-route-reason");
    const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
    const parser = new SSEParser();
    for (;;) {
      const { value, done } = await reader.read();
      for (const ev of done ? parser.end() : parser.feed(value)) run.handle(ev);
      if (done) break;
    }
    if (run.done) {
      const secs = ((performance.now() - run.t0) / 1000).toFixed(1);
      ui.status.textContent = `Done in ${secs} s.`;
    } else if (!run.failed) {
      run.fail("The connection ended before the answer was complete.");
    }
  } catch (err) {
    if (err && err.name === "AbortError") {
      run.leaveQueue();
      ui.result.hidden = false;
      ui.status.textContent = run.started ? "Stopped." : "Cancelled: you left the queue.";
    } else {
      run.fail(`The request failed: ${err && err.message ? err.message : err}`);
    }
  } finally {
    run.leaveQueue();
    ui.answer.setAttribute("aria-busy", "false");
    ui.send.disabled = false;
    ui.send.textContent = "Send";
    ui.stop.hidden = true;
    current = null;
  }
}

function abort() {
  if (current !== null) current.controller.abort();
}

ui.form.addEventListener("submit", send);
ui.cancel.addEventListener("click", abort);
ui.stop.addEventListener("click", abort);
ui.prompt.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) ui.form.requestSubmit();
});
keyForm(() => { clearError(); loadModels(); });
loadModels();
