// The API key a person enters in the page, for a gateway with auth on. It is kept in this
// tab's sessionStorage only (gone when the tab closes; never localStorage, never a cookie)
// and sent only as `Authorization: Bearer`, never in a URL, so it stays out of access logs,
// history and Referer headers. The form shows only once the gateway asked for a key (a
// 401) or while one is set: with auth off the pages look as they always did.

const STORE = "slotgate.key";
const $ = (id) => document.getElementById(id);

export function apiKey() {
  try { return sessionStorage.getItem(STORE) || ""; } catch { return ""; }
}

/** `headers` plus the Authorization header when a key was entered. */
export function withKey(headers = {}) {
  const key = apiKey();
  return key ? { ...headers, Authorization: `Bearer ${key}` } : headers;
}

// The form's fields, the same on every page (each page holds an empty <form id="key-form">).
const FIELDS = `
  <label for="api-key">API key</label>
  <input id="api-key" name="api-key" type="password" autocomplete="off"
         spellcheck="false" placeholder="sk-…" aria-describedby="key-state">
  <button type="submit" class="secondary">Use key</button>
  <button id="key-forget" type="button" class="secondary" hidden>Forget</button>
  <span id="key-state" class="hint" role="status"></span>`;

/** Wire the key form in the top bar; `changed()` runs after a key is set or forgotten. */
export function keyForm(changed) {
  const form = $("key-form");
  form.innerHTML = FIELDS;
  const input = $("api-key");
  const forget = $("key-forget");
  const state = $("key-state");
  const show = () => {
    const set = apiKey() !== "";
    form.hidden = !set && form.dataset.needed === undefined;
    forget.hidden = !set;
    state.textContent = set ? "Key set for this tab." : "";
    input.value = "";
    input.placeholder = set ? "••••••••" : "sk-…";
  };
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const key = input.value.trim();
    if (!key) { input.focus(); return; }
    try { sessionStorage.setItem(STORE, key); } catch { /* storage disabled: not kept */ }
    show();
    changed();
  });
  forget.addEventListener("click", () => {
    try { sessionStorage.removeItem(STORE); } catch { /* nothing kept */ }
    show();
    changed();
  });
  show();
}

/** Point the person at the key form (after a 401). */
export function askForKey() {
  const form = $("key-form");
  form.dataset.needed = "true";
  form.hidden = false;
  $("api-key").focus();
}

export function keyAccepted() {
  delete $("key-form").dataset.needed;
}
