"""The inbox's stylesheet and script (served from /static/; kept in Python so the package data of
the wheel needs nothing new). No framework, no build: the page is server-rendered and works
without the script (forms post, the page reloads); the script adds the countdowns, the live update
from /events (server-sent events) and decisions without a reload."""

CSS = r"""
:root { --fg: #1b1f24; --muted: #57606a; --line: #d0d7de; --bg: #fff; --card: #f6f8fa; --ok: #1a7f37;
        --bad: #b42318; --focus: #0550ae; font-family: system-ui, -apple-system, "Segoe UI", sans-serif; }
* { box-sizing: border-box; }
body { margin: 0 auto; max-width: 62rem; padding: 0.75rem; color: var(--fg); background: var(--bg); line-height: 1.45; }
header { display: flex; flex-wrap: wrap; align-items: baseline; gap: 0.25rem 1rem; border-bottom: 1px solid var(--line); }
header h1 { font-size: 1.35rem; margin: 0.25rem 0; flex: 1 1 auto; }
#live { flex: 1 0 100%; margin: 0 0 0.5rem; min-height: 1.45em; }
h2 { font-size: 1.15rem; margin: 1rem 0 0.5rem; }
h3 { font-size: 1.05rem; margin: 0 0 0.5rem; overflow-wrap: anywhere; }
.ns, .note { color: var(--muted); font-weight: normal; }
.note { font-size: 0.9rem; }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 6px; padding: 0.75rem; margin: 0 0 0.75rem; }
.card.gone { opacity: 0.75; }
.facts { display: grid; grid-template-columns: repeat(auto-fill, minmax(9.5rem, 1fr)); gap: 0.25rem 1rem; margin: 0 0 0.5rem; }
.facts div { min-width: 0; }
.facts div.wide { grid-column: 1 / -1; }
code.target { overflow-wrap: anywhere; font-weight: 600; }
.facts dt { font-size: 0.8rem; color: var(--muted); }
.facts dd { margin: 0; overflow-wrap: anywhere; }
.countdown { font-variant-numeric: tabular-nums; display: inline-block; min-width: 9ch; }
.countdown.urgent { color: var(--bad); font-weight: 600; }
.task { overflow-wrap: anywhere; margin: 0.25rem 0 0.5rem; }
pre.args { background: var(--bg); border: 1px solid var(--line); padding: 0.5rem; overflow: auto; max-height: 24rem;
           white-space: pre-wrap; overflow-wrap: anywhere; font-size: 0.85rem; }
.sha code { overflow-wrap: anywhere; font-size: 0.8rem; }
details { margin: 0.25rem 0 0.5rem; }
summary { cursor: pointer; padding: 0.25rem 0; }
.laps li { margin-bottom: 0.4rem; overflow-wrap: anywhere; }
.said { margin: 0.15rem 0; font-style: italic; }
.warn { color: var(--bad); }
form.decide { border-top: 1px solid var(--line); padding-top: 0.5rem; }
form.decide label { display: block; font-weight: 600; }
textarea { width: 100%; font: inherit; padding: 0.4rem; border: 1px solid var(--muted); border-radius: 4px; resize: vertical; }
textarea[aria-invalid="true"] { border-color: var(--bad); }
.buttons { display: flex; gap: 0.75rem; margin-top: 0.5rem; }
button { font: inherit; min-height: 44px; min-width: 7rem; padding: 0.4rem 1rem; border-radius: 6px; border: 1px solid var(--line); cursor: pointer; }
button.approve { background: var(--ok); color: #fff; border-color: var(--ok); }
button.reject { background: #fff; color: var(--bad); border-color: var(--bad); }
button:disabled { opacity: 0.55; cursor: not-allowed; }
button.link { min-height: 0; min-width: 0; border: 0; background: none; color: var(--focus); text-decoration: underline; padding: 0; }
:focus-visible { outline: 3px solid var(--focus); outline-offset: 2px; }
/* the result line keeps its space whether empty or not: nothing moves under the pointer */
.result { min-height: 2.9em; margin: 0.4rem 0 0; }
.result.ok { color: var(--ok); } .result.error, .error { color: var(--bad); }
.readonly { border-top: 1px solid var(--line); padding-top: 0.5rem; color: var(--muted); }
.gone-note { font-weight: 600; }
.notice { background: #fff8c5; border: 1px solid #d4a72c; padding: 0.5rem; border-radius: 4px; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; width: 100%; font-size: 0.9rem; }
th { white-space: nowrap; }
th, td { text-align: left; border-bottom: 1px solid var(--line); padding: 0.3rem 0.4rem; vertical-align: top; overflow-wrap: anywhere; }
.state-approved { color: var(--ok); } .state-rejected, .state-timedout { color: var(--bad); } .state-withdrawn { color: var(--muted); }
form.inline { display: inline; }
#login form { display: grid; gap: 0.5rem; max-width: 30rem; }
#login input { font: inherit; padding: 0.4rem; }
nav.tabs { display: flex; gap: 1rem; }
nav.tabs a { color: var(--focus); }
nav.tabs a[aria-current="page"] { color: var(--fg); font-weight: 600; text-decoration: none; }
form.filters { display: flex; flex-wrap: wrap; align-items: center; gap: 0.4rem 0.6rem; margin: 0.75rem 0 0; }
form.filters label { font-size: 0.85rem; color: var(--muted); }
form.filters select, form.filters input { font: inherit; padding: 0.3rem; min-height: 36px; }
form.filters button { min-height: 36px; min-width: 0; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.phase { font-size: 0.85rem; padding: 0.05rem 0.4rem; border-radius: 1rem; border: 1px solid var(--line); white-space: nowrap; }
.phase-succeeded { color: var(--ok); border-color: var(--ok); }
.phase-failed, .phase-budgetexceeded, .phase-deadlineexceeded { color: var(--bad); border-color: var(--bad); }
.phase-awaitingapproval { color: #9a6700; border-color: #d4a72c; }
.phase-running, .phase-retrying { color: var(--focus); border-color: var(--focus); }
.crumbs { margin: 0.5rem 0 0; font-size: 0.9rem; }
.run-name { margin-top: 0.25rem; overflow-wrap: anywhere; }
svg.timeline, svg.cost { width: 100%; height: auto; display: block; background: var(--card); border: 1px solid var(--line); border-radius: 4px; }
svg.cost { max-width: 30rem; }
svg text.axis { font-size: 10px; fill: var(--muted); }
svg line.axis { stroke: var(--line); }
.tl-continue, .tl-awaiting-approval { fill: #54aeff; background: #54aeff; }
.tl-done { fill: var(--ok); background: var(--ok); }
.tl-failed { fill: var(--bad); background: var(--bad); }
.tl-wait { fill: #d4a72c; background: #d4a72c; }
.tl-running { fill: #8250df; background: #8250df; }
.failed-attempts { white-space: normal; color: var(--bad); }
.legend .key { display: inline-block; width: 0.9em; height: 0.9em; vertical-align: middle; margin-left: 0.6rem; }
rect.cost-lap { fill: #b6e3ff; }
polyline.cost-line { fill: none; stroke: var(--focus); stroke-width: 2; }
circle.cost-dot { fill: var(--focus); }
details.lap { border: 1px solid var(--line); border-radius: 6px; padding: 0.25rem 0.6rem; margin: 0 0 0.5rem; background: var(--card); }
details.lap ol.messages { padding-left: 1.25rem; overflow-wrap: anywhere; }
table.tools code, .stored, .facts code { overflow-wrap: anywhere; }
table.runs td:first-child, table.runs td:nth-child(2), table.runs td:nth-child(5) { white-space: nowrap; overflow-wrap: normal; }
table.runs td:last-child { min-width: 14rem; }
details.lap summary { overflow-wrap: anywhere; }
.replayed { color: var(--muted); font-style: italic; }
.outcome-failed { color: var(--bad); } .outcome-done { color: var(--ok); }
.ev-warning td:nth-child(2) { color: var(--bad); }
table.events td:nth-child(-n+4), table.laps-table td:nth-child(4) { white-space: nowrap; overflow-wrap: normal; }
@media (max-width: 40rem) {
  body { padding: 0.5rem; }
  .buttons button { flex: 1 1 0; }
  th, td { padding: 0.25rem; }
}
"""

JS = r"""
(function () {
  "use strict";
  // sign-in link of `make dev` (/login#token=...): the token never reaches the server's logs as a
  // URL. It is filled in, never submitted: signing in takes a click (a link must not sign anyone
  // in as whoever made it: login CSRF)
  var tokenInput = document.getElementById("token");
  if (tokenInput && location.hash.indexOf("#token=") === 0) {
    tokenInput.value = decodeURIComponent(location.hash.slice(7));
    history.replaceState(null, "", location.pathname);
    document.getElementById("from-link").hidden = false;
    document.querySelector("#login-form button[type=submit]").focus();
    return;
  }
  var main = document.getElementById("main");
  if (!main) { return; }
  var live = document.getElementById("live");

  function fmt(s) {
    s = Math.max(0, Math.floor(s));
    var d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600), m = Math.floor(s % 3600 / 60), x = s % 60;
    if (d) { return d + "d" + (h ? h + "h" : ""); }
    if (h) { return h + "h" + (m ? m + "m" : ""); }
    if (m) { return m + "m" + (x ? x + "s" : ""); }
    return x + "s";
  }
  function tick() {
    var now = Date.now();
    document.querySelectorAll("[data-deadline]").forEach(function (t) {
      var d = Date.parse(t.getAttribute("data-deadline"));
      if (isNaN(d)) { return; }
      var left = (d - now) / 1000;
      t.textContent = left <= 0 ? "overdue" : fmt(left) + " left";
      t.classList.toggle("urgent", left < 300);
    });
    document.querySelectorAll("[data-since]").forEach(function (t) {
      var s = Date.parse(t.getAttribute("data-since"));
      if (!isNaN(s)) { t.textContent = fmt((now - s) / 1000) + " ago"; }
    });
  }
  setInterval(tick, 1000);
  tick();

  function decidedText(doc, key) {
    var row = doc.querySelector('#history tr[data-key="' + CSS.escape(key) + '"]');
    if (!row) { return "No longer waiting (decided elsewhere, timed out, or the run moved on)."; }
    var cells = row.querySelectorAll("td");
    return "No longer waiting: " + cells[4].textContent + " by " + cells[1].textContent +
      (cells[5].textContent ? " (" + cells[5].textContent + ")" : "") + ".";
  }
  // A card that is no longer pending keeps its place and its height (nothing below it moves): the
  // note goes into the result line, whose space is reserved, or the card's height is fixed
  function tombstone(card, text) {
    var h = card.offsetHeight;
    card.classList.add("gone");
    card.style.height = h + "px";
    card.style.overflow = "hidden";
    card.querySelectorAll("button, textarea, input").forEach(function (e) { e.disabled = true; });
    card.querySelectorAll("[data-deadline]").forEach(function (t) { t.removeAttribute("data-deadline"); t.textContent = "-"; });
    card.querySelectorAll("[data-since]").forEach(function (t) { t.removeAttribute("data-since"); });
    var note = card.querySelector(".result");
    if (!note) {
      note = document.createElement("p");
      card.insertBefore(note, card.children[1] || null);
    }
    note.className = "result gone-note";
    note.setAttribute("role", "status");
    note.textContent = text;
  }
  function merge(doc) {
    var cards = document.getElementById("cards"), fresh = doc.getElementById("cards");
    if (!cards || !fresh) { return; }
    var incoming = {};
    fresh.querySelectorAll("article.card").forEach(function (a) { incoming[a.id] = a; });
    cards.querySelectorAll("article.card").forEach(function (old) {
      var nu = incoming[old.id];
      delete incoming[old.id];
      if (!nu) { tombstone(old, decidedText(doc, old.getAttribute("data-key"))); return; }
      if (old.classList.contains("gone") || nu.getAttribute("data-rv") === old.getAttribute("data-rv")) {
        if (old.classList.contains("gone")) { old.replaceWith(nu); }
        return;
      }
      var oc = old.querySelector("input[name=callId]"), nc = nu.querySelector("input[name=callId]");
      if ((oc && oc.value) !== (nc && nc.value) || !old.querySelector("form") !== !nu.querySelector("form")) {
        old.replaceWith(nu);  // another call, or the permission changed
      } else {  // the same call: refresh the facts, keep what the person is typing
        old.querySelector("dl.facts").replaceWith(nu.querySelector("dl.facts"));
        old.setAttribute("data-rv", nu.getAttribute("data-rv"));
      }
    });
    Object.keys(incoming).forEach(function (id) { cards.appendChild(incoming[id]); });  // new ones last
    var empty = cards.querySelector("p.empty");
    if (empty && cards.querySelector("article.card")) { empty.remove(); }
    var count = document.querySelector("#pending-h .count"), fcount = doc.querySelector("#pending-h .count");
    if (count && fcount) { count.textContent = fcount.textContent; }
    var hist = document.getElementById("history"), fhist = doc.getElementById("history");
    if (hist && fhist) { hist.replaceWith(fhist); }
    tick();
  }
  // the run explorer's pages (/runs, /runs/NS/NAME): their live part (#explore) is replaced as a
  // whole on every change; the laps the person opened stay open
  var liveUrl = main.getAttribute("data-live");
  function swap(doc) {
    var cur = document.getElementById("explore"), fresh = doc.getElementById("explore");
    if (!cur || !fresh) { return; }
    cur.querySelectorAll("details[id]").forEach(function (d) {
      var f = fresh.querySelector("#" + CSS.escape(d.id));
      if (f) { f.open = d.open; }
    });
    cur.replaceWith(fresh);
    tick();
  }
  var busy = false, again = false, timer = null;
  function refresh() {
    if (busy) { again = true; return; }
    busy = true;
    fetch(liveUrl || "/fragment", {credentials: "same-origin", cache: "no-store"}).then(function (r) {
      if (r.status === 401) { location.href = "/login"; return null; }
      return r.ok ? r.text() : null;
    }).then(function (text) {
      if (text !== null && text !== undefined) {
        (liveUrl ? swap : merge)(new DOMParser().parseFromString(text, "text/html"));
      }
    }).catch(function () {}).then(function () {
      busy = false;
      if (again) { again = false; refresh(); }
    });
  }
  if (window.EventSource) {
    var es = new EventSource("/events");
    es.addEventListener("open", function () {
      live.textContent = main.getAttribute("data-live-text") || "Live: decisions made anywhere show up here.";
      refresh();
    });
    es.addEventListener("change", function () { clearTimeout(timer); timer = setTimeout(refresh, 150); });
    es.addEventListener("error", function () { live.textContent = "Reconnecting…"; });
  } else {
    live.textContent = "This browser has no live updates: reload to see new approvals.";
  }

  main.addEventListener("submit", function (ev) {
    var form = ev.target;
    if (!form.classList || !form.classList.contains("decide")) { return; }
    ev.preventDefault();
    var decision = ev.submitter && ev.submitter.value ? ev.submitter.value : "approve";
    var out = form.querySelector(".result"), reason = form.querySelector("textarea");
    if (decision === "reject" && !reason.value.trim()) {
      out.className = "result error";
      out.textContent = "A reason is required to reject.";
      reason.setAttribute("aria-invalid", "true");
      reason.focus();
      return;
    }
    reason.removeAttribute("aria-invalid");
    var body = new URLSearchParams(new FormData(form));
    body.set("decision", decision);
    var buttons = form.querySelectorAll("button");
    buttons.forEach(function (b) { b.disabled = true; });
    out.className = "result";
    out.textContent = "Sending…";
    fetch("/decide", {method: "POST", body: body, credentials: "same-origin",
                      headers: {"Accept": "application/json"}}).then(function (r) {
      return r.json().then(function (j) { return {ok: r.ok, j: j}; });
    }).then(function (res) {
      out.className = "result " + (res.ok ? "ok" : "error");
      out.textContent = res.j.message;
      if (!res.ok) { buttons.forEach(function (b) { b.disabled = false; }); }
    }).catch(function (e) {
      out.className = "result error";
      out.textContent = "The inbox did not answer: " + e;
      buttons.forEach(function (b) { b.disabled = false; });
    });
  });
})();
"""
