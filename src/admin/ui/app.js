// The live downloads page: asks the admin API for the downloads every second and draws them.
//
// Everything the API answers (download ids, clients, paths) may come from anyone who can send a
// request to the proxy, so it reaches the page as text only (textContent, attribute values),
// never as markup. The admin token, when the API needs one, is typed in by the user, kept in
// this tab's sessionStorage and sent as a bearer token; it never goes into an address.
"use strict";

const POLL_INTERVAL_MS = 1000;
// Bytes arrive unevenly (socket buffers, a response ending and the next beginning): the rate is
// taken over several polls to smooth them.
const RATE_WINDOW_MS = 10000;
// An object's digest is published once a whole pass over it was checked: look again now and then
// until it is known, and seldom after (the object may change).
const DIGEST_RETRY_MS = 3000;
const DIGEST_REFRESH_MS = 30000;
const LIST_LIMIT = 100;
const TOKEN_KEY = "rangeway.admin-token";

const page = {
  status: document.getElementById("status"),
  tokenForm: document.getElementById("token-form"),
  tokenInput: document.getElementById("token"),
  forgetToken: document.getElementById("forget-token"),
  rows: document.querySelector("#downloads tbody"),
  empty: document.getElementById("empty"),
};

/** Bytes sent per download as successive polls saw them: id -> [{at, bytes, started, object}]. */
const samples = new Map();
/** What is known of each object's digests: key -> {text, fetchedAt, known, pending}. */
const digests = new Map();

let pollTimer = null;
// Each poll's number: a poll begun early (a token was typed) supersedes one still under way.
let pollGeneration = 0;

class Unauthorized extends Error {}

function storedToken() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

async function getJson(path) {
  const headers = { Accept: "application/json" };
  const token = storedToken();
  if (token) {
    headers.Authorization = `Bearer ${token}`;
  }
  const response = await fetch(path, { headers, cache: "no-store", credentials: "omit" });
  if (response.status === 401) {
    throw new Unauthorized();
  }
  return { status: response.status, body: await response.json() };
}

function showStatus(text, isError) {
  page.status.textContent = text;
  page.status.classList.toggle("error", isError);
}

function formatBytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let value = n;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${unit === 0 ? value : value.toFixed(1)} ${units[unit]}`;
}

function formatTime(unixSeconds) {
  const date = new Date(unixSeconds * 1000);
  const today = new Date().toDateString() === date.toDateString();
  return today ? date.toLocaleTimeString() : date.toLocaleString();
}

/** The download's rate in bytes per second over the last polls, or null before there are two. */
function rate(download, now) {
  let seen = samples.get(download.id);
  // The same id may begin a new session (another object, a new version): start over.
  if (!seen || seen[0].started !== download.started_at || seen[0].object !== download.object) {
    seen = [];
    samples.set(download.id, seen);
  }
  const { bytes, started_at: started, object } = download;
  seen.push({ at: now, bytes, started, object });
  while (seen.length > 2 && now - seen[1].at >= RATE_WINDOW_MS) {
    seen.shift();
  }
  const first = seen[0];
  const last = seen[seen.length - 1];
  const seconds = (last.at - first.at) / 1000;
  return seconds > 0 ? (last.bytes - first.bytes) / seconds : null;
}

/** The object's digest as the page shows it, and a fetch of it when due. */
function digestText(objectKey, now) {
  let entry = digests.get(objectKey);
  if (!entry) {
    entry = { text: "…", fetchedAt: -Infinity, known: false, pending: false };
    digests.set(objectKey, entry);
  }
  const due = now - entry.fetchedAt >= (entry.known ? DIGEST_REFRESH_MS : DIGEST_RETRY_MS);
  if (due && !entry.pending) {
    entry.pending = true;
    fetchDigest(objectKey, entry).finally(() => {
      entry.pending = false;
      entry.fetchedAt = performance.now();
    });
  }
  return entry.text;
}

async function fetchDigest(objectKey, entry) {
  try {
    const { status, body } = await getJson(`/v1/objects?key=${encodeURIComponent(objectKey)}`);
    if (status === 404) {
      entry.text = "object not known";
      entry.known = false;
      return;
    }
    const names = Object.keys(body.digests || {});
    entry.known = names.length > 0;
    entry.text = entry.known
      ? names.map((name) => `${name}: ${body.digests[name]}`).join("\n")
      : "not known yet";
  } catch (error) {
    entry.text = error instanceof Unauthorized ? "token needed" : "unavailable";
    entry.known = false;
  }
}

function cell(row, className, text) {
  const td = document.createElement("td");
  td.className = className;
  if (text !== undefined) {
    td.textContent = text;
  }
  row.append(td);
  return td;
}

function progressCell(row, download) {
  const td = cell(row, "progress");
  const bar = document.createElement("progress");
  // An empty object is complete at once: show it full.
  bar.max = Math.max(download.size, 1);
  bar.value = download.size === 0 ? 1 : download.delivered_bytes;
  const label = document.createElement("span");
  const delivered = formatBytes(download.delivered_bytes);
  label.textContent = `${delivered} / ${formatBytes(download.size)} (${download.percent}%)`;
  td.append(bar, label);
}

function rangesCell(row, download) {
  const td = cell(row, "ranges");
  const strip = document.createElement("div");
  strip.className = "strip";
  const size = download.size;
  const ranges = Array.isArray(download.delivered) ? download.delivered : [];
  strip.title = ranges.map(([start, end]) => `${start}-${end - 1}`).join(", ") || "none";
  for (const [start, end] of ranges) {
    const span = document.createElement("span");
    // Style properties set from script are not inline markup: the page's policy allows them.
    span.style.left = `${size > 0 ? (start / size) * 100 : 0}%`;
    span.style.width = `${size > 0 ? ((end - start) / size) * 100 : 100}%`;
    strip.append(span);
  }
  td.append(strip);
}

function timeCell(row, className, unixSeconds) {
  const td = cell(row, className, formatTime(unixSeconds));
  td.title = new Date(unixSeconds * 1000).toISOString();
}

function objectPath(download) {
  const prefix = `${download.route}|`;
  const key = download.object;
  return key.startsWith(prefix) ? key.slice(prefix.length) : key;
}

function downloadRow(download, now) {
  const row = document.createElement("tr");
  row.className = download.complete ? "complete" : "active";
  row.dataset.id = download.id;
  cell(row, "id", download.id);
  cell(row, "route", download.route);
  cell(row, "object", objectPath(download));
  cell(row, "client", download.client);
  progressCell(row, download);
  rangesCell(row, download);
  const perSecond = rate(download, now);
  const shownRate = download.complete || perSecond === null ? "–" : `${formatBytes(perSecond)}/s`;
  cell(row, "rate", shownRate);
  cell(row, "state", download.complete ? "complete" : "active");
  timeCell(row, "started", download.started_at);
  timeCell(row, "updated", download.updated_at);
  cell(row, "digest", digestText(download.object, now));
  return row;
}

function render(downloads) {
  const now = performance.now();
  page.rows.replaceChildren(...downloads.map((download) => downloadRow(download, now)));
  page.empty.hidden = downloads.length > 0;
  const listed = new Set(downloads.map((download) => download.id));
  for (const id of samples.keys()) {
    if (!listed.has(id)) {
      samples.delete(id);
    }
  }
  const active = downloads.filter((download) => !download.complete).length;
  const more = downloads.length === LIST_LIMIT ? ` (the ${LIST_LIMIT} updated last)` : "";
  const asOf = new Date().toLocaleTimeString();
  showStatus(`${downloads.length} downloads${more}, ${active} active; as of ${asOf}`, false);
}

async function poll() {
  clearTimeout(pollTimer);
  pollGeneration += 1;
  const generation = pollGeneration;
  try {
    const { status, body } = await getJson(`/v1/downloads?limit=${LIST_LIMIT}`);
    if (generation !== pollGeneration) {
      return;
    }
    if (status !== 200) {
      showStatus(`The admin API answered ${status}: ${body.error || ""}`, true);
    } else {
      page.tokenForm.hidden = true;
      page.forgetToken.hidden = !storedToken();
      render(body.downloads);
    }
  } catch (error) {
    if (generation !== pollGeneration) {
      return;
    }
    if (error instanceof Unauthorized) {
      showStatus(
        storedToken() ? "The admin API refused this token." : "The admin API needs its token.",
        true,
      );
      page.tokenForm.hidden = false;
      page.forgetToken.hidden = true;
    } else {
      showStatus(`Cannot reach the admin API: ${error.message}`, true);
    }
  }
  pollTimer = setTimeout(poll, POLL_INTERVAL_MS);
}

page.tokenForm.addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, page.tokenInput.value.trim());
  page.tokenInput.value = "";
  digests.clear();
  poll();
});

page.forgetToken.addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  digests.clear();
  poll();
});

poll();
