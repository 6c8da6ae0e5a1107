// The inferq chat page: streams /v1/chat/completions (stream: true) over fetch and parses the
// Server-Sent Events itself (EventSource cannot POST), showing tokens as they arrive and the
// live rate. No framework, no build step, nothing loaded from other origins.
"use strict";

const $ = (id) => document.getElementById(id);
const KEY_STORAGE = "inferq.apiKey";

const chat = {
  history: [],         // [{role, content}] sent with every request
  controller: null,    // AbortController of the stream in flight
};

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

async function errorMessage(response) {
  try {
    const body = await response.json();
    if (body && body.error && body.error.message) return `${response.status}: ${body.error.message}`;
  } catch (_) { /* not JSON */ }
  return `${response.status} ${response.statusText}`;
}

function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = `message ${role}`;
  div.textContent = text;
  $("log").appendChild(div);
  div.scrollIntoView({ block: "end" });
  return div;
}

function setStats(text, data = {}) {
  const stats = $("stats");
  stats.textContent = text;
  for (const [name, value] of Object.entries(data)) stats.dataset[name] = String(value);
}

async function loadModels() {
  const select = $("model");
  try {
    const response = await fetch("/v1/models", { headers: headers() });
    if (!response.ok) {
      setStats(response.status === 401 ? "this server needs an API key" : await errorMessage(response));
      return;
    }
    const body = await response.json();
    select.replaceChildren(...body.data.map((m) => new Option(m.id, m.id)));
    if (!body.data.length) setStats("no model yet: is a worker running?");
    else setStats("ready", { state: "ready" });
  } catch (err) {
    setStats(`cannot reach the API: ${err}`);
  }
}

// SSE framing: events are separated by a blank line; an event's `data:` lines join with "\n".
// Returns the complete events' data and the unfinished remainder of the buffer.
function takeEvents(buffer) {
  const blocks = buffer.split(/\r\n\r\n|\n\n|\r\r/);
  const rest = blocks.pop();
  const events = [];
  for (const block of blocks) {
    const data = [];
    for (const line of block.split(/\r\n|\n|\r/)) {
      if (line.startsWith("data:")) data.push(line.slice(line.startsWith("data: ") ? 6 : 5));
    }
    if (data.length) events.push(data.join("\n"));
  }
  return { events, rest };
}

function rateText(tokens, firstAt, lastAt, startedAt) {
  const ttft = firstAt ? `first token ${Math.round(firstAt - startedAt)} ms` : "waiting for the first token";
  // NOTE: the rate counts the tokens after the first over the time since it (decode speed),
  // so that queueing and prefill time show up in the first-token figure alone.
  const seconds = (lastAt - firstAt) / 1000;
  const tps = tokens > 1 && seconds > 0 ? (tokens - 1) / seconds : 0;
  return { text: `${tokens} tokens · ${tps.toFixed(1)} tok/s · ${ttft}`, tps };
}

async function send(text) {
  chat.history.push({ role: "user", content: text });
  addMessage("user", text);
  const bubble = addMessage("assistant", "");
  bubble.dataset.state = "streaming";
  const controller = new AbortController();
  chat.controller = controller;
  $("send").disabled = true;
  $("stop").disabled = false;

  const startedAt = performance.now();
  let firstAt = 0;
  let lastAt = 0;
  let chunks = 0;
  let usage = null;
  let answer = "";
  let failure = null;
  const body = {
    model: $("model").value,
    messages: chat.history,
    stream: true,
    stream_options: { include_usage: true },
  };
  const maxTokens = parseInt($("max-tokens").value, 10);
  if (maxTokens > 0) body.max_tokens = maxTokens;
  const temperature = parseFloat($("temperature").value);
  if (temperature >= 0) body.temperature = temperature;
  setStats("waiting for the first token", { state: "waiting" });

  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(body), signal: controller.signal,
    });
    if (!response.ok) throw new Error(await errorMessage(response));
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    let finished = false;
    while (!finished) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      const taken = takeEvents(buffer);
      buffer = taken.rest;
      for (const data of taken.events) {
        if (data === "[DONE]") { finished = true; break; }
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message || "the stream failed");
        if (chunk.usage) usage = chunk.usage;
        const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
        if (delta && delta.content) {
          const now = performance.now();
          if (!firstAt) firstAt = now;
          lastAt = now;
          chunks += 1;
          answer += delta.content;
          bubble.textContent = answer;
          bubble.scrollIntoView({ block: "end" });
          const rate = rateText(chunks, firstAt, lastAt, startedAt);
          setStats(rate.text, { state: "streaming", tokens: chunks, tps: rate.tps.toFixed(2) });
        }
      }
    }
    bubble.dataset.state = "done";
  } catch (err) {
    if (controller.signal.aborted) {
      bubble.dataset.state = "stopped";
    } else {
      failure = err.message || String(err);
      bubble.dataset.state = "error";
    }
  } finally {
    chat.controller = null;
    $("send").disabled = false;
    $("stop").disabled = true;
  }

  if (answer) chat.history.push({ role: "assistant", content: answer });
  if (failure) addMessage("error", failure);
  const tokens = usage ? usage.completion_tokens : chunks;
  const rate = rateText(tokens, firstAt, lastAt || performance.now(), startedAt);
  const state = bubble.dataset.state;
  const summary = state === "stopped" ? `stopped · ${rate.text}` : rate.text;
  setStats(summary, { state, tokens, tps: rate.tps.toFixed(2) });
  const meta = document.createElement("span");
  meta.className = "meta";
  meta.textContent = summary;
  bubble.appendChild(meta);
}

function init() {
  $("api-key").value = localStorage.getItem(KEY_STORAGE) || "";
  $("api-key").addEventListener("change", () => {
    localStorage.setItem(KEY_STORAGE, $("api-key").value.trim());
    loadModels();
  });
  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = $("prompt").value.trim();
    if (!text || chat.controller) return;
    $("prompt").value = "";
    send(text);
  });
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => chat.controller && chat.controller.abort());
  $("clear").addEventListener("click", () => {
    if (chat.controller) chat.controller.abort();
    chat.history = [];
    $("log").replaceChildren();
    setStats("ready", { state: "ready" });
  });
  loadModels();
}

document.addEventListener("DOMContentLoaded", init);
