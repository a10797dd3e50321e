// gatehead's chat page: streams agent turns from POST /v1/agent/chat (server-sent events over fetch)
// and shows each turn's decision, the gate's three probabilities, its sources, and a marker on an answer that
// its cited passage does not carry. No build step.
"use strict";

const $ = (id) => document.getElementById(id);
const store = window.localStorage;
const STEPS = { retrieve: "Retrieving documents…", gate: "Checking the documents…", rewrite: "Searching again…",
                contextualize: "Reading the conversation…", generate: "Answering…" };
const FAILURES = {
  401: "This server needs an API key: enter it under “API key” below, then send again.",
  409: "This conversation is still answering the previous question; wait for it, then send again.",
  413: "The message is too long for this server.",
  503: "The server is busy or starting up; try again in a moment.",
  504: "The server took too long to answer; try again.",
};

let thread = store.getItem("gatehead.thread") || newThreadId();

function newThreadId() {
  const id = (crypto.randomUUID ? crypto.randomUUID() : String(Date.now()) + Math.random()).replace(/[^A-Za-z0-9-]/g, "");
  store.setItem("gatehead.thread", id);
  return id;
}

function headers() {
  const key = $("api-key").value.trim();
  return { "Content-Type": "application/json", ...(key ? { Authorization: `Bearer ${key}` } : {}) };
}

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function addTurn(role, text) {
  const item = element("li", `turn ${role}`);
  item.append(element("div", "bubble", text));
  $("conversation").append(item);
  item.scrollIntoView({ block: "end" });
  return item;
}

function showFailure(item, message) {
  item.classList.add("error");
  item.querySelector(".bubble").textContent = message;
  $("status").textContent = "";
}

async function failureMessage(response) {
  let detail = "";
  try { detail = (await response.json()).error.message; } catch (_) { /* not JSON */ }
  return FAILURES[response.status] || `The server answered ${response.status}: ${detail || response.statusText}`;
}

function showGate(item, turn) {
  const gate = element("div", "gate");
  const decision = turn.decision || "error";
  const badge = element("span", `badge ${decision}`, decision.replace("_", " "));
  badge.setAttribute("aria-label", `decision: ${decision}`);
  gate.append(badge);
  // The decision is what the user got: a refusal the model wrote after the gate said answer says so.
  if (turn.refusal_reason === "generated") gate.append(element("span", "note", "the model refused"));
  if (turn.grounded === false) {
    const warning = element("span", "ungrounded", "not grounded in the cited passage");
    warning.setAttribute("role", "note");
    gate.append(warning);
  }
  for (const label of ["answer", "refuse", "search"]) {
    const p = (turn.probabilities || {})[label];
    if (p === undefined) continue;
    const prob = element("span", "prob");
    prob.dataset.label = label;
    const meter = element("meter");
    meter.min = 0; meter.max = 1; meter.value = p;
    meter.setAttribute("aria-hidden", "true");
    prob.append(`${label} `, meter, ` ${p.toFixed(3)}`);
    gate.append(prob);
  }
  item.append(gate);
  const passages = turn.passages || [];
  if (passages.length) {
    const list = element("ol", "sources");
    list.setAttribute("aria-label", "Sources");
    for (const passage of passages) {
      const entry = element("li");
      const more = element("details");
      more.append(element("summary", "", `${passage.title || passage.source} (${passage.source})`));
      more.append(element("pre", "", passage.text));
      entry.append(more);
      list.append(entry);
    }
    item.append(list);
  }
}

async function readEvents(response, onEvent) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const kind = /^event: (.*)$/m.exec(block);
      const data = /^data: (.*)$/m.exec(block);
      if (kind && data) onEvent(kind[1], JSON.parse(data[1]));
    }
  }
}

async function send(message) {
  addTurn("user", message);
  const item = addTurn("assistant", "");
  const bubble = item.querySelector(".bubble");
  $("send").disabled = true;
  $("status").textContent = "Sending…";
  let finished = false;
  let response;
  try {
    response = await fetch("/v1/agent/chat", {
      method: "POST", headers: headers(), body: JSON.stringify({ message, thread_id: thread, stream: true }),
    });
  } catch (_) {
    showFailure(item, "Cannot reach the server: it may be down or restarting. Try again in a moment.");
    $("send").disabled = false;
    return;
  }
  try {
    if (!response.ok) {
      if (response.status === 401) $("settings").open = true;
      showFailure(item, await failureMessage(response));
      return;
    }
    await readEvents(response, (kind, data) => {
      if (kind === "node") $("status").textContent = STEPS[data.node] || "";
      else if (kind === "token") bubble.textContent += data.text;
      else if (kind === "final") {
        finished = true;
        if (data.error) { showFailure(item, `Retrieval failed: ${data.error}`); return; }
        bubble.textContent = data.answer;
        showGate(item, data);
        $("status").textContent = "";
      } else if (kind === "error") {
        finished = true;
        showFailure(item, FAILURES[data.code] || `The answer failed: ${data.message}`);
      }
    });
    if (!finished) showFailure(item, "The connection closed before the answer was complete; send again.");
  } catch (error) {  // the stream broke off, or an event could not be read
    showFailure(item, `The answer was cut off (${error.message}); send again.`);
  } finally {
    $("send").disabled = false;
    $("message").focus();
  }
}

async function loadThread() {
  try {
    const response = await fetch(`/v1/agent/threads/${encodeURIComponent(thread)}`, { headers: headers() });
    if (response.status === 404) return;
    if (!response.ok) {
      if (response.status === 401) $("settings").open = true;
      $("status").textContent = await failureMessage(response);
      return;
    }
    const { turns } = await response.json();
    for (const turn of turns) addTurn(turn.role, turn.text);
    if (turns.length) $("status").textContent = "Continuing your last conversation.";
  } catch (_) {
    $("status").textContent = "Cannot reach the server: it may be down or restarting.";
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("api-key").value = store.getItem("gatehead.key") || "";
  $("api-key").addEventListener("change", () => {
    store.setItem("gatehead.key", $("api-key").value.trim());
    $("settings").open = false;
    $("conversation").replaceChildren();
    loadThread();
  });
  $("ask").addEventListener("submit", (event) => {
    event.preventDefault();
    const message = $("message").value.trim();
    if (!message || $("send").disabled) return;
    $("message").value = "";
    send(message);
  });
  $("message").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {  // not while an IME composes
      event.preventDefault();
      $("ask").requestSubmit();
    }
  });
  $("new-thread").addEventListener("click", () => {
    thread = newThreadId();
    $("conversation").replaceChildren();
    $("status").textContent = "New conversation.";
    $("message").focus();
  });
  loadThread();
  $("message").focus();
});
