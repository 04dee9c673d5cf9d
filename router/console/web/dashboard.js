// The live dashboard: one card per slot pool, updated by the gateway's `event: pools`
// stream (GET /dashboard/events). No polling. The stream is read with fetch(), not
// EventSource, because EventSource cannot send a header: with auth on, the key a person
// entered goes as `Authorization: Bearer` (never in the URL). A stream that ends is
// opened again after a pause; a refusal (e.g. too many dashboards) after a longer one; a
// 401 waits for a key. Text only, no HTML.

import { askForKey, keyAccepted, keyForm, withKey } from "./key.js";
import { SSEParser } from "./sse.js";

const $ = (id) => document.getElementById(id);
const poolsEl = $("pools");
const conn = $("conn");
const RETRY_MS = 10000; // after a refusal
const RECONNECT_MS = 3000; // after a stream that ended or broke (EventSource's pause)
const MAX_SEGMENTS = 32; // more slots than this: one continuous bar instead of one per slot
const cards = new Map(); // pool name -> {root, fields...}

function setConn(state, text) {
  conn.dataset.state = state;
  if (conn.textContent !== text) conn.textContent = text; // a live region: only real changes
}

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function figure(label) {
  const wrap = el("div");
  const value = el("dd", "", "–");
  wrap.append(el("dt", "", label), value);
  return [wrap, value];
}

function labelled(label, labelId) {
  const row = el("div", "row-label");
  const name = el("span", "", label);
  name.id = labelId;
  const value = el("span", "", "–");
  row.append(name, value);
  return [row, value];
}

function makeCard(pool) {
  const root = el("article", "card pool");
  const id = `pool-${cards.size}`;
  root.setAttribute("aria-labelledby", `${id}-name`);
  root.dataset.pool = pool.name;

  const title = el("div", "pool-title");
  const name = el("h2", "", pool.name);
  name.id = `${id}-name`;
  title.append(name, el("span", "pool-model", pool.model || ""));

  const [slotsRow, slotsText] = labelled("Slots busy", `${id}-slots`);
  const slots = el("div", "slots");
  slots.setAttribute("role", "meter");
  slots.setAttribute("aria-labelledby", `${id}-slots`);
  slots.setAttribute("aria-valuemin", "0");

  const [queueRow, queueText] = labelled("Queue", `${id}-queue`);
  const queue = el("div", "meter queue");
  queue.setAttribute("role", "meter");
  queue.setAttribute("aria-labelledby", `${id}-queue`);
  queue.setAttribute("aria-valuemin", "0");
  const queueFill = el("span");
  queue.append(queueFill);

  const figures = el("dl", "figures");
  const [etaWrap, eta] = figure("Next free slot");
  const [rejWrap, rejected] = figure("429s (1 min)");
  const [fbWrap, fallback] = figure("Fallbacks (1 min)");
  figures.append(etaWrap, rejWrap, fbWrap);

  const slotsBlock = el("div");
  slotsBlock.append(slotsRow, slots);
  const replicas = el("div", "replicas");
  replicas.hidden = true;
  slotsBlock.append(replicas);
  const queueBlock = el("div");
  queueBlock.append(queueRow, queue);
  const tenants = makeTenants(id);
  const fleet = makeFleet(id);
  root.append(title, slotsBlock, fleet.wrap, queueBlock, tenants.wrap, figures);
  return { root, slots, slotsText, queue, queueFill, queueText, eta, rejected, fallback,
           capacity: -1, id, replicas, replicaNames: "", replicaRows: [], tenants, fleet };
}

// Its replicas in service and healthy, those running out what they hold (a drain, a reload
// without them), and, when the backend scales, the count the gateway asks an autoscaler for.
function makeFleet(id) {
  const wrap = el("dl", "figures fleet");
  wrap.setAttribute("aria-label", "Replicas");
  wrap.hidden = true;
  const out = { wrap };
  for (const [key, label] of [["ready", "Replicas ready"], ["draining", "Draining"],
                              ["desired", "Desired"]]) {
    const [box, value] = figure(label);
    box.dataset.figure = key;
    value.id = `${id}-${key}`;
    wrap.append(box);
    out[key] = value;
    out[`${key}Box`] = box;
  }
  return out;
}

function renderFleet(card, pool) {
  const { fleet } = card;
  fleet.wrap.hidden = typeof pool.ready !== "number"; // a gateway without the counts
  if (fleet.wrap.hidden) return;
  const ready = Math.max(0, pool.ready | 0);
  const draining = Math.max(0, pool.draining | 0);
  fleet.ready.textContent = String(ready);
  fleet.draining.textContent = String(draining);
  const scaled = typeof pool.desired === "number"; // only a backend with `scaling`
  fleet.desiredBox.hidden = !scaled;
  const desired = scaled ? Math.max(0, pool.desired | 0) : 0;
  fleet.desired.textContent = scaled ? String(desired) : "–";
  fleet.desired.classList.toggle("hot", scaled && desired > ready); // wants more than it has
}

// A pool with a queue: each tenant's share of its tokens served in the last minute, and
// its requests waiting ("–" while the pool's line cannot tell).
function makeTenants(id) {
  const wrap = el("div", "tenants");
  wrap.hidden = true;
  const table = el("table");
  const caption = el("caption", "", "Tenants · tokens served (1 min)");
  caption.id = `${id}-tenants`;
  const head = el("tr");
  for (const name of ["Tenant", "Tokens", "Share", "Waiting"]) {
    const th = el("th", "", name);
    th.scope = "col";
    head.append(th);
  }
  const thead = el("thead");
  thead.append(head);
  const body = el("tbody");
  table.append(caption, thead, body);
  wrap.append(table);
  return { wrap, body };
}

function renderTenants(card, pool) {
  const list = Array.isArray(pool.tenants) ?
    pool.tenants.filter((t) => t && typeof t.tenant === "string") : [];
  card.tenants.wrap.hidden = list.length === 0;
  card.tenants.body.replaceChildren(...list.map((t) => {
    const row = el("tr");
    row.dataset.tenant = t.tenant;
    const share = t.share === null || t.share === undefined ? null : Number(t.share);
    const name = el("th", "", t.tenant);
    name.scope = "row";
    const shareCell = el("td", "share", share === null ? "–" : `${(100 * share).toFixed(1)}%`);
    const part = share === null ? 0 : Math.min(100, Math.max(0, 100 * share));
    shareCell.style.background = // a bar behind the figure
      `linear-gradient(to right, var(--accent-soft) ${part}%, transparent ${part}%)`;
    const waiting = t.waiting === null || t.waiting === undefined ? "–" : String(t.waiting | 0);
    row.append(name, el("td", "", String(Math.max(0, Number(t.tokens) || 0))), shareCell,
               el("td", "", waiting));
    return row;
  }));
}

// A group of replicas: one thin bar per replica under the pool's bar (none for one).
function renderReplicas(card, pool) {
  const list = Array.isArray(pool.replicas) ?
    pool.replicas.filter((r) => r && typeof r.name === "string") : [];
  const shown = list.length > 1 ? list : [];
  const names = JSON.stringify(shown.map((r) => r.name));
  if (card.replicaNames !== names) {
    card.replicaNames = names;
    card.replicaRows = shown.map((r, i) => {
      const row = el("div", "replica");
      row.dataset.replica = r.name;
      const [label, text] = labelled(r.name, `${card.id}-replica-${i}`);
      const bar = el("div", "meter");
      bar.setAttribute("role", "meter");
      bar.setAttribute("aria-labelledby", `${card.id}-replica-${i}`);
      bar.setAttribute("aria-valuemin", "0");
      const fill = el("span");
      bar.append(fill);
      row.append(label, bar);
      return { row, text, bar, fill };
    });
    card.replicas.replaceChildren(...card.replicaRows.map((r) => r.row));
    card.replicas.hidden = shown.length === 0;
  }
  shown.forEach((r, i) => {
    const { row, text, bar, fill } = card.replicaRows[i];
    const slots = Math.max(0, r.slots | 0);
    const active = Math.max(0, r.active | 0);
    const healthy = r.healthy !== false;
    row.classList.toggle("down", !healthy);
    text.textContent = `${active} / ${slots}${healthy ? "" : " · down"}`;
    fill.style.width = slots ? `${Math.min(100, (100 * active) / slots)}%` : "0%";
    bar.classList.toggle("full", slots > 0 && active >= slots);
    bar.setAttribute("aria-valuemax", String(slots));
    bar.setAttribute("aria-valuenow", String(active));
  });
}

function renderSlots(card, pool) {
  const capacity = Math.max(0, pool.capacity | 0);
  const active = Math.min(capacity, Math.max(0, pool.active | 0));
  if (card.capacity !== capacity) {
    card.capacity = capacity;
    card.slots.replaceChildren();
    if (capacity <= MAX_SEGMENTS) {
      card.slots.className = "slots";
      for (let i = 0; i < capacity; i++) card.slots.append(el("span", "slot"));
    } else {
      card.slots.className = "slots meter";
      card.slots.append(el("span"));
    }
  }
  const full = capacity > 0 && active >= capacity;
  card.slots.classList.toggle("full", full);
  if (capacity <= MAX_SEGMENTS) {
    [...card.slots.children].forEach((s, i) => s.classList.toggle("busy", i < active));
  } else {
    card.slots.firstChild.style.width = `${(100 * active) / capacity}%`;
  }
  card.slots.setAttribute("aria-valuemax", String(capacity));
  card.slots.setAttribute("aria-valuenow", String(active));
  card.slotsText.textContent = `${active} / ${capacity}`;
}

function render(pools) {
  if (!Array.isArray(pools)) return;
  if (cards.size === 0) poolsEl.replaceChildren();
  const seen = new Set();
  let busy = 0, capacity = 0, queued = 0, rejected = 0, fallback = 0;
  for (const pool of pools) {
    if (!pool || typeof pool.name !== "string") continue;
    seen.add(pool.name);
    let card = cards.get(pool.name);
    if (!card) {
      card = makeCard(pool);
      cards.set(pool.name, card);
      poolsEl.append(card.root);
    }
    renderSlots(card, pool);
    renderReplicas(card, pool);
    renderFleet(card, pool);
    renderTenants(card, pool);
    const limit = Math.max(0, pool.queue_limit | 0);
    const depth = Math.max(0, pool.queued | 0);
    card.queueText.textContent = `${depth} / ${limit}`;
    card.queueFill.style.width = limit ? `${Math.min(100, (100 * depth) / limit)}%` : "0%";
    card.queue.classList.toggle("full", limit > 0 && depth >= limit);
    card.queue.setAttribute("aria-valuemax", String(limit));
    card.queue.setAttribute("aria-valuenow", String(depth));
    const eta = Number(pool.eta_s);
    card.eta.textContent = eta > 0 ? `≈ ${eta < 10 ? eta.toFixed(1) : Math.round(eta)} s` : "now";
    card.rejected.textContent = String(pool.rejected_1m | 0);
    card.rejected.classList.toggle("hot", (pool.rejected_1m | 0) > 0);
    card.fallback.textContent = String(pool.fallback_1m | 0);
    busy += pool.active | 0;
    capacity += pool.capacity | 0;
    queued += depth;
    rejected += pool.rejected_1m | 0;
    fallback += pool.fallback_1m | 0;
  }
  for (const [name, card] of cards) {
    if (!seen.has(name)) {
      card.root.remove();
      cards.delete(name);
    }
  }
  $("total-busy").textContent = `${busy} / ${capacity}`;
  $("total-queued").textContent = String(queued);
  $("total-rejected").textContent = String(rejected);
  $("total-fallback").textContent = String(fallback);
  $("updated").textContent = `Updated ${new Date().toLocaleTimeString()}`;
  if (conn.dataset.state !== "live") setConn("live", "Live");
}

let feed = null; // the AbortController of the stream being read
let retry = 0; // the pending reconnect timer

function later(ms) {
  clearTimeout(retry);
  retry = setTimeout(connect, ms);
}

async function connect() {
  clearTimeout(retry);
  if (feed !== null) feed.abort();
  const mine = new AbortController();
  feed = mine;
  setConn("connecting", "Connecting…");
  try {
    const res = await fetch("/dashboard/events", {
      headers: withKey({ Accept: "text/event-stream" }), cache: "no-store", signal: mine.signal,
    });
    if (res.status === 401) {
      setConn("down", "Needs an API key: enter it at the top of the page");
      askForKey();
      return; // a key entered (keyForm) connects again
    }
    if (!res.ok || !res.body) {
      // refused (e.g. 503: too many dashboards): try again later
      setConn("down", "Disconnected · retrying in 10 s");
      later(RETRY_MS);
      return;
    }
    keyAccepted();
    setConn("live", "Live");
    const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
    const parser = new SSEParser();
    for (;;) {
      const { value, done } = await reader.read();
      for (const ev of done ? parser.end() : parser.feed(value)) {
        if (ev.event !== "pools") continue;
        let pools = null;
        try { pools = JSON.parse(ev.data); } catch { continue; }
        render(pools);
      }
      if (done) break;
    }
  } catch (err) {
    if (mine.signal.aborted) return; // replaced by a newer connection
  }
  if (feed === mine) {
    setConn("connecting", "Reconnecting…");
    later(RECONNECT_MS);
  }
}

keyForm(connect);
connect();
