// The status page: polls /v1/status and renders it. Text only ever goes in through textContent, so
// nothing in a follower's error message can become markup. On a failed poll the last data stays, marked stale.
"use strict";

const POLL_MS = 3000;

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (key === "class") node.className = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function set(id, text, cls) {
  const node = document.getElementById(id);
  node.textContent = text;
  if (cls !== undefined) node.className = "value " + cls;
}

function seconds(value) {
  if (value === null || value === undefined) return "";
  return value < 60 ? value.toFixed(1) + " s" : Math.round(value / 60) + " min";
}

function ago(iso, now) {
  const s = (Date.parse(now) - Date.parse(iso)) / 1000;
  return Number.isFinite(s) ? seconds(Math.max(0, s)) + " ago" : "";
}

function when(iso) {  // "2026-01-31 12:00:05 UTC"
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? iso : d.toISOString().slice(0, 19).replace("T", " ") + " UTC";
}

function fill(tbody, rows) {
  tbody.replaceChildren(...rows);
}

function processText(p) {  // the owning commitline process: host:pid (kind, started ...)
  return p ? p.host + ":" + p.pid + " (" + p.kind + ", started " + String(p.started_at).slice(0, 19).replace("T", " ") +
    " UTC)" : "";
}

function renderFollowers(doc) {
  const rows = doc.followers.map((f) => {
    const owner = f.owned_by || processText(f.process);  // the publisher's: its instances
    const live = (f.alive ? "live" : "not live") + (owner ? ": " + owner : "");
    return el("tr", {id: "follower-" + f.name, class: f.problems.length ? "bad" : ""},
      el("td", {class: "name"}, f.name),
      el("td", {class: "status"}, f.status),
      el("td", {class: "live " + (f.alive ? "good" : "muted")}, live),
      el("td", {class: "num position"}, f.position),
      el("td", {class: "num lag-events"}, f.lag_events),
      el("td", {class: "num lag-seconds"}, seconds(f.lag_seconds)),
      el("td", {class: "num moved"}, f.last_moved_seconds === null ? "" : seconds(f.last_moved_seconds) + " ago"),
      el("td", {class: "problem"}, f.problems.join("; ")));
  });
  fill(document.querySelector("#followers tbody"), rows);
}

function renderPublisher(doc) {
  const group = doc.publisher;
  document.getElementById("publisher-section").hidden = !group;
  if (!group) {
    return;
  }
  document.getElementById("publisher-summary").textContent = "(" + group.instances.length + " instance(s), " +
    group.bucket_count + " buckets)";
  const rows = group.buckets.map((b) => el("tr", {id: "bucket-" + b.bucket, class: b.problems.length ? "bad" : ""},
    el("td", {class: "name"}, b.name),
    el("td", {class: "status"}, b.status),
    el("td", {class: "live " + (b.alive ? "good" : "muted")}, b.alive ? processText(b.process) || b.owner : "not live"),
    el("td", {class: "num position"}, b.position),
    el("td", {class: "num lag-events"}, b.lag_events),
    el("td", {class: "num lag-seconds"}, seconds(b.lag_seconds)),
    el("td", {class: "problem"}, b.problems.join("; "))));
  fill(document.querySelector("#publisher-buckets tbody"), rows);
}

function renderBlocked(doc) {
  const items = doc.blocked.map((b) => el("div", {class: "blocked", id: "blocked-" + b.name},
    el("p", {},
      el("strong", {}, b.name), " stopped at poison event ",
      el("span", {class: "poison-position"}, b.poison_position),
      b.event_type ? " (" + b.event_type + ")" : "", ": ", b.message),
    el("p", {class: "muted"}, "After fixing the cause, retry it; or skip exactly that event:"),
    ...b.commands.map((c) => el("pre", {class: "command"}, c))));
  document.getElementById("blocked").replaceChildren(...items);
  document.getElementById("blocked-none").hidden = items.length > 0;
}

function renderStuck(doc) {
  const rows = doc.stuck_sagas.map((s) => el("tr", {id: "stuck-" + s.id},
    el("td", {class: "order"}, s.id), el("td", {class: "saga"}, s.saga), el("td", {class: "tenant"}, s.tenant),
    el("td", {class: "state"}, s.state),
    el("td", {class: "reason"}, s.reason), el("td", {class: "cmd"}, el("code", {class: "command"}, s.command))));
  fill(document.querySelector("#stuck tbody"), rows);
  document.getElementById("stuck").hidden = rows.length === 0;
  document.getElementById("stuck-none").hidden = rows.length > 0;
}

function renderAudit(doc) {
  const last = doc.audit.last;
  const table = document.getElementById("audit");
  document.getElementById("audit-none").hidden = last !== null;
  table.hidden = last === null;
  if (last === null) {
    set("audit-verdict", "never", "muted");
    return;
  }
  const verdict = last.ok ? "OK" : "BROKEN";
  set("audit-verdict", verdict, last.ok ? "good" : "bad");
  const scope = last.scope === "all" ? "every stream"
    : "aggregate " + last.aggregate_id + " (tenant " + last.tenant + ")";
  const facts = [
    ["verdict", verdict, "audit-ok " + (last.ok ? "good" : "bad")],
    ["finished", when(last.finished_at) + " (" + ago(last.finished_at, doc.generated_at) + ")", "audit-when"],
    ["scope", scope, "audit-scope"],
    ["streams", last.streams, "audit-streams"],
    ["events", last.events, "audit-events"],
    ["broken streams", last.broken, "audit-broken"],
    ["took", seconds(last.seconds), "audit-seconds"],
  ];
  const full = doc.audit.last_all;
  if (last.scope !== "all") {
    facts.push(["last full verification", full === null ? "never"
      : (full.ok ? "OK" : "BROKEN") + ", " + full.streams + " streams, " + full.events + " events, "
        + ago(full.finished_at, doc.generated_at), "audit-full"]);
  }
  fill(table.tBodies[0], facts.map(([label, value, cls]) => el("tr", {},
    el("th", {}, label), el("td", {class: cls}, value))));
}

function render(doc) {
  set("head", String(doc.head));
  set("health", doc.healthy ? "healthy" : doc.problems.length + " problem" + (doc.problems.length > 1 ? "s" : ""),
      doc.healthy ? "good" : "bad");
  set("blocked-count", String(doc.blocked.length), doc.blocked.length ? "bad" : "good");
  set("stuck-count", String(doc.stuck_sagas.length), doc.stuck_sagas.length ? "bad" : "good");
  fill(document.getElementById("problems"), doc.problems.map((p) => el("li", {}, p)));
  renderFollowers(doc);
  renderPublisher(doc);
  renderBlocked(doc);
  renderStuck(doc);
  renderAudit(doc);
}

async function refresh() {
  const line = document.getElementById("refresh");
  try {
    const response = await fetch("/v1/status", {cache: "no-store", headers: {Accept: "application/json"}});
    const body = await response.json();
    if (!response.ok) {  // a problem document: its title, not its detail (advice to a command's caller)
      throw new Error(body.code === "store_unavailable" ? "the database does not answer"
        : body.title || response.status + " " + response.statusText);
    }
    render(body);
    document.body.classList.remove("stale");
    line.className = "muted";
    line.textContent = "schema " + body.schema + " · updated " + when(body.generated_at) + " · refreshes every "
      + POLL_MS / 1000 + " s";
    document.body.dataset.loaded = body.generated_at;
  } catch (error) {
    document.body.classList.add("stale");  // the figures below are the last known, greyed: not a green "healthy"
    set("health", "unknown", "bad");
    line.className = "bad";
    line.textContent = "cannot refresh (" + error.message + "); showing the last data · retrying every "
      + POLL_MS / 1000 + " s";
  } finally {
    setTimeout(refresh, POLL_MS);
  }
}

refresh();
