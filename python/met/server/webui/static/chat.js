// met's chat page: one conversation streamed from /v1/chat/completions. Plain browser JavaScript,
// no dependencies; every URL is relative, so the page also works behind a path prefix.
"use strict";

const KEY_STORAGE = "met-api-key";
const $ = (id) => document.getElementById(id);
const chat = { model: null, messages: [], controller: null, key: localStorage.getItem(KEY_STORAGE) || "" };

function headers() {
  const h = { "Content-Type": "application/json" };
  if (chat.key) h.Authorization = "Bearer " + chat.key;
  return h;
}

function setStatus(text) {
  $("status").textContent = text;
}

function askForKey(note) {
  $("key-note").textContent = note;
  $("key-form").hidden = false;
  $("api-key").focus();
  setStatus("API key needed");
}

async function errorMessage(response) {
  try {
    const body = await response.json();
    if (body.error && body.error.message) return body.error.message;
  } catch (_) {
    // not JSON: fall through to the status line
  }
  return `HTTP ${response.status} ${response.statusText}`;
}

async function connect() {
  let response;
  try {
    response = await fetch("v1/models", { headers: headers() });
  } catch (e) {
    setStatus("server unreachable; retrying");
    setTimeout(connect, 2000);
    return;
  }
  if (response.status === 401) {
    askForKey(chat.key ? "That key was refused; enter the server's --api-key." : "This server needs an API key.");
    return;
  }
  if (response.status === 503) {
    setStatus("the model is loading…");
    setTimeout(connect, 2000);
    return;
  }
  if (!response.ok) {
    setStatus(await errorMessage(response));
    return;
  }
  const body = await response.json();
  chat.model = body.data[0].id;
  $("model").textContent = chat.model;
  $("key-form").hidden = true;
  setStatus("ready");
  $("prompt").focus();
}

function addMessage(role, text) {
  const node = document.createElement("div");
  node.className = "message " + role;
  const body = document.createElement("div");
  body.className = "body";
  body.textContent = text;
  node.appendChild(body);
  $("messages").appendChild(node);
  scrollDown();
  return node;
}

function scrollDown() {
  const box = $("messages");
  box.scrollTop = box.scrollHeight;
}

// Server-sent events of a fetch body: yields each `data:` payload parsed, until [DONE].
async function* sseEvents(stream) {
  const reader = stream.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        yield JSON.parse(data);
      }
    }
  }
}

function requestBody() {
  const messages = [];
  const system = $("system").value.trim();
  if (system) messages.push({ role: "system", content: system });
  messages.push(...chat.messages);
  const body = {
    model: chat.model,
    messages,
    stream: true,
    stream_options: { include_usage: true },
    temperature: Number($("temperature").value),
  };
  const maxTokens = parseInt($("max-tokens").value, 10);
  if (maxTokens > 0) body.max_tokens = maxTokens;
  return body;
}

// One answer's figures: time to first token, and decode speed over the tokens after the first.
function showStats(node, run) {
  const tokens = run.usage ? run.usage.completion_tokens : run.pieces;
  const stats = document.createElement("div");
  stats.className = "stats";
  const parts = [];
  if (run.firstAt !== null) {
    const ttft = run.firstAt - run.startedAt;
    const decodeS = (run.endedAt - run.firstAt) / 1000;
    const perS = tokens > 1 && decodeS > 0 ? (tokens - 1) / decodeS : 0;
    stats.dataset.ttftMs = ttft.toFixed(0);
    stats.dataset.tokensPerS = perS.toFixed(1);
    parts.push(`TTFT ${ttft.toFixed(0)} ms`, `${perS.toFixed(1)} tokens/s`);
  }
  stats.dataset.tokens = String(tokens);
  parts.push(`${run.usage ? "" : "~"}${tokens} tokens`);
  if (run.stopped) parts.push("stopped");
  else if (run.finish) parts.push(`finish: ${run.finish}`);
  stats.textContent = parts.join(" · ");
  node.appendChild(stats);
}

function showError(node, text) {
  const error = document.createElement("div");
  error.className = "error";
  error.textContent = text;
  node.appendChild(error);
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("stop").disabled = !busy;
  setStatus(busy ? "generating…" : "ready");
}

async function streamAnswer(node, run) {
  const body = node.querySelector(".body");
  const response = await fetch("v1/chat/completions", {
    method: "POST",
    headers: headers(),
    body: JSON.stringify(requestBody()),
    signal: chat.controller.signal,
  });
  if (response.status === 401) askForKey("The server refused the key; enter its --api-key.");
  if (!response.ok) throw new Error(await errorMessage(response));
  for await (const event of sseEvents(response.body)) {
    if (event.error) throw new Error(event.error.message);
    if (event.usage) run.usage = event.usage;
    const choice = event.choices && event.choices[0];
    if (!choice) continue;
    if (choice.delta && choice.delta.content) {
      if (run.firstAt === null) run.firstAt = performance.now();
      run.text += choice.delta.content;
      run.pieces += 1;
      body.textContent = run.text;
      scrollDown();
    }
    if (choice.finish_reason) run.finish = choice.finish_reason;
  }
}

async function send(event) {
  event.preventDefault();
  const text = $("prompt").value.trim();
  if (!text || chat.controller || !chat.model) return;
  $("prompt").value = "";
  chat.messages.push({ role: "user", content: text });
  addMessage("user", text);
  const node = addMessage("assistant", "");
  const run = { startedAt: performance.now(), firstAt: null, endedAt: 0, text: "", pieces: 0, usage: null, finish: null, stopped: false };
  chat.controller = new AbortController();
  setBusy(true);
  try {
    await streamAnswer(node, run);
  } catch (e) {
    if (e.name === "AbortError") run.stopped = true;
    else showError(node, e.message);
  }
  run.endedAt = performance.now();
  chat.controller = null;
  setBusy(false);
  if (run.text) chat.messages.push({ role: "assistant", content: run.text });
  else chat.messages.pop(); // nothing came back: the question is not part of the conversation
  showStats(node, run);
  scrollDown();
}

// Aborting the fetch closes the connection; the server sees the client leave and ends the
// request, which frees its KV blocks.
function stop() {
  if (chat.controller) chat.controller.abort();
}

function newChat() {
  stop();
  chat.messages = [];
  $("messages").replaceChildren();
  $("prompt").focus();
}

function saveKey(event) {
  event.preventDefault();
  chat.key = $("api-key").value.trim();
  localStorage.setItem(KEY_STORAGE, chat.key);
  connect();
}

$("composer").addEventListener("submit", send);
$("stop").addEventListener("click", stop);
$("new-chat").addEventListener("click", newChat);
$("key-form").addEventListener("submit", saveKey);
$("prompt").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) {
    event.preventDefault();
    $("composer").requestSubmit();
  }
});
connect();
