(function () {
"use strict";
const D = JSON.parse(document.getElementById("report-data").textContent);
const R = D.rows, PAGE = 100, byKey = new Map(R.map((r, i) => [r.k, i]));
const $ = (s) => document.querySelector(s);
// Every value from the data (names, numbers, classes included) goes into HTML through esc: a
// hand-edited output may hold markup in any column, a string in a numeric one.
const esc = (s) => String(s == null ? "" : s).replace(/[&<>"']/g,
  (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
const reEsc = (s) => s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
const st = {q: "", status: "", method: "", task: "", length: "", err: "", fld: "", val: null, sort: "", dir: 1, page: 0};
// Extraction runs: the fields in schema order (each row's x lists them), a value shown as text.
const FIELDS = [...new Set(R.flatMap((r) => (r.x || []).map((x) => x[0])))];
const fx = (r, f) => (r.x || []).find((x) => x[0] === f);
const shown = (v) => { if (v == null) return null; try { const p = JSON.parse(v); return typeof p === "string" ? p : Array.isArray(p) ? p.join(", ") : String(p); } catch (e) { return v; } };
function fieldMatch(r) {
  if (!st.fld) return true;
  const x = fx(r, st.fld), v = x ? x[1] : null;
  return st.val === "*" ? v != null : !st.val ? v == null : v === st.val;
}

const hasMem = (r) => (r.st || []).some((s) => s[1] === "m");
function status(r) {
  if (r.e) return "error";
  if (r.s == null) return "unscored";
  return r.s >= 1 ? "correct" : r.s > 0 ? "partial" : "wrong";
}
const STATUS = {
  "": () => true, correct: (r) => status(r) === "correct", wrong: (r) => status(r) === "wrong",
  partial: (r) => status(r) === "partial", error: (r) => !!r.e, unscored: (r) => status(r) === "unscored",
  lost: (r) => r.l != null, never: (r) => !r.e && r.a && r.a.length && r.h && r.f == null,
  noev: (r) => !r.e && r.p && !r.ev && hasMem(r),
  evlost: (r) => !!r.rt && r.rt.c[1] > r.rt.c[2],
};
// A row's evidence timeline (rt.i[j][3]): run-length coded states per memory step.
const RS = {".": ["u", "not yet read"], "?": ["g", "held before it was read"], "h": ["h", "held"], "x": ["x", "read, not held"]};
function evidenceHtml(rt, n) {
  const yes = (b) => b ? '<span class="ok">yes</span>' : '<span class="bad">no</span>';
  let h = '<h3>Evidence in memory</h3><div class="legend">' + esc(rt.c[0]) + " item(s) read, " + esc(rt.c[1]) +
    " captured (held after their read), " + esc(rt.c[2]) + " retained (held at the answer) · per memory step:" +
    '<i class="rs-u"></i>not yet read<i class="rs-h"></i>held<i class="rs-x"></i>read, not held' +
    '<i class="rs-g"></i>held before it was read</div><table class="rtab"><tr><th>evidence</th><th>read at step</th>' +
    "<th>captured</th><th>retained</th><th>memory steps 0–" + esc(n - 1) + "</th></tr>";
  for (const it of rt.i) {
    let at = 0, bar = "";
    for (const m of String(it[3]).matchAll(/([.?hx])(\d+)/g)) {
      const len = Number(m[2]), k = RS[m[1]];
      bar += '<i class="rs rs-' + esc(k[0]) + '" style="left:' + pct(at, n) + ";width:" + pct(len, n) + '" title="steps ' +
        esc(at) + "–" + esc(at + len - 1) + ": " + esc(k[1]) + '"></i>';
      at += len;
    }
    h += '<tr class="rt-item"><td>' + esc(it[0]) + ' <span class="mut">' + esc(it[1]) + "</span></td><td>" +
      (it[2] == null ? '<span class="mut">never</span>' : esc(it[2])) + "</td><td>" + yes(it[4]) + "</td><td>" +
      yes(it[5]) + '</td><td><div class="rbar">' + bar + "</div></td></tr>";
  }
  return h + "</table>" + (rt.more ? '<p class="mut">' + esc(rt.more) + " more item(s) not drawn</p>" : "");
}
const COLS = [["id", "id", (r) => r.id]];
if (D.facets.method) COLS.push(["method", "method", (r) => r.m]);
if (D.facets.task) COLS.push(["task", "task", (r) => r.t]);
if (D.facets.length) COLS.push(["length", "length", (r) => r.L]);
for (const f of FIELDS.slice(0, 8)) COLS.push([f, ["x", f].join(":"), (r) => { const x = fx(r, f); return x ? shown(x[1]) : null; }]);
COLS.push(["chunks", "n", (r) => r.n], ["tokens", "ct", (r) => r.ct]);
if (!FIELDS.length) COLS.push(["score", "s", (r) => r.s], ["found", "f", (r) => r.f], ["lost", "l", (r) => r.l], ["prediction", "p", (r) => r.p]);
COLS.push(["error", "e", (r) => r.e]);

function setup() {
  const f = $("#filters");
  let h = '<input type="search" id="fq" placeholder="search id, question, prediction, error">';
  h += sel("status", [["", "all rows"], ["correct", "correct"], ["wrong", "wrong"], ["partial", "partial"],
    ["error", "error"], ["unscored", "no answers"], ["lost", "answer lost"], ["never", "answer never in memory"],
    ["noev", "prediction not in memory"], ["evlost", "evidence lost from memory"]]);
  for (const k of ["method", "task", "length"]) {
    if (D.facets[k]) h += sel(k, [["", "all " + k + "s"]].concat(D.facets[k].map((v) => [String(v), String(v)])));
  }
  h += '<span id="count" class="mut"></span>';
  f.innerHTML = h;
  $("#fq").addEventListener("input", (e) => { st.q = e.target.value; st.page = 0; draw(); });
  for (const s of f.querySelectorAll("select")) {
    s.addEventListener("change", (e) => { st[e.target.dataset.k] = e.target.value; st.err = ""; st.page = 0; draw(); });
  }
  let th = "<tr>" + COLS.map((c) => '<th data-k="' + esc(c[1]) + '">' + esc(c[0]) + "</th>").join("") + "</tr>";
  $("#rows thead").innerHTML = th;
  for (const t of document.querySelectorAll("#rows th")) {
    t.addEventListener("click", () => {
      const k = t.dataset.k;
      st.dir = st.sort === k ? -st.dir : 1; st.sort = k; draw();
    });
  }
  $("#rows tbody").addEventListener("click", (e) => {
    const tr = e.target.closest("tr[data-k]");
    if (tr) location.hash = "row=" + encodeURIComponent(tr.dataset.k);
  });
}
function sel(k, opts) {
  return '<select data-k="' + esc(k) + '" id="f-' + esc(k) + '">' +
    opts.map((o) => '<option value="' + esc(o[0]) + '">' + esc(o[1]) + "</option>").join("") + "</select>";
}
function filtered() {
  const q = st.q.toLowerCase(), sf = STATUS[st.status] || STATUS[""];
  let out = R.filter((r) => sf(r) && (!st.method || r.m === st.method) && (!st.task || r.t === st.task) &&
    (!st.length || String(r.L) === st.length) && (st.err === "" || String(r.eg) === st.err) && fieldMatch(r) &&
    (!q || [r.id, r.q || "", r.p || "", r.e || ""].join("\u0001").toLowerCase().includes(q)));
  if (st.sort) {
    const c = COLS.find((c) => c[1] === st.sort), g = c[2], d = st.dir;
    out = out.slice().sort((a, b) => {
      const x = g(a), y = g(b);
      if (x == null || y == null) return (x == null) - (y == null);
      return (x < y ? -1 : x > y ? 1 : 0) * d;
    });
  }
  return out;
}
function cell(c, r) {
  const v = c[2](r);
  if (c[1] === "s") return v == null ? "" : '<span class="' + (v >= 1 ? "ok" : "bad") + '">' + (+v).toFixed(2) + "</span>";
  return esc(v);
}
function draw() {
  const rows = filtered(), n = rows.length, pages = Math.max(1, Math.ceil(n / PAGE));
  st.page = Math.min(st.page, pages - 1);
  const cur = location.hash.startsWith("#row=") ? decodeURIComponent(location.hash.slice(5)) : null;
  $("#rows tbody").innerHTML = rows.slice(st.page * PAGE, (st.page + 1) * PAGE).map((r) =>
    '<tr data-k="' + esc(r.k) + '"' + (r.k === cur ? ' class="sel"' : "") + ">" +
    COLS.map((c) => '<td title="' + esc(c[2](r)) + '">' + cell(c, r) + "</td>").join("") + "</tr>").join("");
  $("#count").innerHTML = n + " of " + R.length + " rows" + (st.fld ? " · " + esc(st.fld) + (st.val === "*" ? " filled" :
    !st.val ? " empty" : " = " + esc(shown(st.val))) + ' <a href="#filter=">clear</a>' : "");
  for (const t of document.querySelectorAll("#rows th")) {
    t.classList.toggle("sorted", t.dataset.k === st.sort); t.classList.toggle("desc", t.dataset.k === st.sort && st.dir < 0);
  }
  $(".pager").innerHTML = pages < 2 ? "" : '<button id="pp">&larr; prev</button> page ' + (st.page + 1) + " of " +
    pages + ' <button id="pn">next &rarr;</button>';
  if (pages > 1) {
    $("#pp").onclick = () => { if (st.page > 0) { st.page--; draw(); } };
    $("#pn").onclick = () => { if (st.page < pages - 1) { st.page++; draw(); } };
  }
}

function needles(r) {
  const list = [];
  for (const a of r.a || []) if (a && a.trim()) list.push([a.trim().toLowerCase(), "gold"]);
  for (const x of r.x || []) {
    const v = shown(x[1]);
    if (v && v.trim() && !list.some((y) => y[0] === v.trim().toLowerCase())) list.push([v.trim().toLowerCase(), "fld"]);
  }
  if (r.p && r.p.trim() && !list.some((x) => x[0] === r.p.trim().toLowerCase())) list.push([r.p.trim().toLowerCase(), "pred"]);
  list.sort((x, y) => y[0].length - x[0].length);
  if (!list.length) return null;
  const cls = new Map(list);
  return {re: new RegExp("(" + list.map((x) => reEsc(x[0])).join("|") + ")", "gi"), cls: cls};
}
function hl(text, nd) {
  if (!nd) return esc(text);
  return text.split(nd.re).map((p, i) => i % 2 ? '<mark class="' + esc(nd.cls.get(p.toLowerCase())) + '">' + esc(p) + "</mark>" : esc(p)).join("");
}
function marked(text, spans) {
  let h = "", at = 0;
  for (const s of spans) { h += esc(text.slice(at, s[0])) + "<mark class=\"" + esc(s[2]) + "\">" + esc(text.slice(s[0], s[1])) + "</mark>"; at = s[1]; }
  return h + esc(text.slice(at));
}
// A memory as HTML against the previous one: ops are flat [i1, i2, j1, j2, ...] over the words
// of both (split as the report's Python does), one quadruple per change.
const TOK = /[ \t\n\r\f\v]+|[^ \t\n\r\f\v]+/g;
function diffHtml(prev, cur, ops, nd) {
  const a = prev.match(TOK) || [], b = cur.match(TOK) || [];
  let h = "", j = 0;
  for (let x = 0; x < ops.length; x += 4) {
    const [i1, i2, j1, j2] = ops.slice(x, x + 4);
    h += hl(b.slice(j, j1).join(""), nd);
    if (i2 > i1) h += "<del>" + hl(a.slice(i1, i2).join(""), nd) + "</del>";
    if (j2 > j1) h += "<ins>" + hl(b.slice(j1, j2).join(""), nd) + "</ins>";
    j = j2;
  }
  return h + hl(b.slice(j).join(""), nd);
}
function pct(x, total) { return (100 * x / total).toFixed(3) + "%"; }

function showRow(k) {
  const el = $("#detail"), i = byKey.get(k);
  const close = '<a class="close" href="#" title="close (Esc)">&times;</a>';
  if (i === undefined) { el.innerHTML = close + "<h2>Row</h2><p class=bad>No row with key " + esc(k) + "</p>"; return; }
  const r = R[i], nd = needles(r), ev = r.ev ? r.ev[0] : null, held = r.h || "";
  let h = close + "<h2>Timeline of row <code>" + esc(r.id) + "</code>" + (r.m ? " · " + esc(r.m) : "") + "</h2>";
  const kv = [["question", esc(r.q)], ["gold answers", (r.a || []).map((a) => "<mark class=gold>" + esc(a) + "</mark>").join(", ")],
    ["prediction", r.p == null ? "" : "<mark class=pred>" + esc(r.p) + "</mark>"],
    ["score", r.s == null ? "" : '<span class="' + (r.s >= 1 ? "ok" : "bad") + '">' + esc(r.s) + "</span>"],
    ["error", r.e ? '<span class="bad">' + esc(r.e) + "</span>" : ""],
    ["document", (r.cl != null ? esc(r.cl) + " chars, " : "") + (r.ct != null ? esc(r.ct) + " tokens, " : "") +
      (r.n != null ? esc(r.n) + " chunks" : "") + (r.tr ? " (truncated)" : "")],
    ["evidence span", r.ev ? "step " + esc(r.ev[0]) + ", chars " + esc(r.ev[1]) + "–" + esc(r.ev[2]) :
      r.p && hasMem(r) && !r.x ? '<span class="warn">prediction not found in any memory</span>' : ""],
    ["gold answer in memory", r.f == null ? (r.a && r.a.length && r.h ? '<span class="bad">never</span>' : "") :
      "found at step " + esc(r.f) + (r.l == null ? ", kept to the end" : ', <span class="bad">lost at step ' + esc(r.l) + "</span>")]];
  if (r.t != null) kv.splice(1, 0, ["task · length", esc(r.t) + " · " + esc(r.L)]);
  h += '<table class="kv">' + kv.filter(([, html]) => html !== "")
    .map(([label, html]) => "<tr><th>" + label + "</th><td>" + html + "</td></tr>").join("") + "</table>";
  if ((r.x || []).length) {
    h += '<h3>Extracted fields</h3><table class="xf"><tr><th>field</th><th>value</th><th>evidence</th></tr>';
    r.x.forEach((x, i) => {
      const v = x[1] == null ? '<span class="mut">null</span>' : esc(shown(x[1]));
      const ev = x[3] == null ? (x[1] == null ? "" : '<span class="warn">value not found in the document</span>') :
        '<a class="fgo" href="#fsn-' + i + '" data-snip="fsn-' + i + '">chars ' + esc(x[3]) + "–" + esc(x[4]) + "</a>" +
        (x[2] == null ? "" : ' · <a class="fgo" href="#step-' + esc(x[2]) + '" data-snip="step-' + esc(x[2]) +
          '">first in memory at step ' + esc(x[2]) + "</a>");
      h += "<tr><td><code>" + esc(x[0]) + "</code></td><td>" + (x[3] == null ? v :
        '<a class="fgo fv" href="#fsn-' + i + '" data-snip="fsn-' + i + '"><mark class=fld>' + v + "</mark></a>") + "</td><td>" + ev + "</td></tr>";
    });
    h += "</table>";
  }
  const mem = (r.st || []).filter((s) => s[1] === "m");
  const total = r.cl || Math.max(1, ...mem.map((s) => s[3] || 0), ...(r.as || []).map((s) => s[1]));
  if (mem.length || (r.as || []).length) {
    h += '<h3>Document</h3><div class="legend">chunks:<i style="background:#b0bec5"></i>memory without the answer' +
      '<i style="background:#a5d6a7"></i>memory holds the gold answer<i style="background:var(--ev)"></i>evidence chunk' +
      '<i style="background:#e53935"></i>gold answer in the text' +
      ((r.x || []).length ? '<i style="background:#2e7d32"></i>extracted value in the text' : "") + '</div><div class="bar">';
    mem.forEach((s, j) => {
      const c = ["seg", held[j] === "1" ? "held" : "", s[0] === ev ? "ev" : "", s[0] === r.f ? "found" : "",
        s[0] === r.l ? "lost" : ""].join(" ");
      h += '<a class="' + c + '" href="#step-' + esc(s[0]) + '" data-step="' + esc(s[0]) + '" style="left:' + pct(s[2], total) +
        ";width:" + pct(s[3] - s[2], total) + '" title="step ' + esc(s[0]) + ": chars " + esc(s[2]) + "–" + esc(s[3]) + '">' +
        esc(s[0]) + "</a>";
    });
    for (const a of r.as || []) h += '<i class="gm" style="left:' + pct(a[0], total) + '" title="gold answer at char ' + esc(a[0]) + '"></i>';
    for (const x of r.x || []) if (x[3] != null) h += '<i class="fmk" style="left:' + pct(x[3], total) + '" title="' + esc(x[0]) + " at char " + esc(x[3]) + '"></i>';
    h += '</div><div class="ticks"><span style="left:0">0</span><span style="left:100%">' + esc(total) + "</span></div>";
  }
  if (r.rt) h += evidenceHtml(r.rt, Math.max(1, mem.length));
  if ((r.xs || []).length) {
    h += "<h3>Field evidence in the source text</h3>";
    for (const s of r.xs) {
      const i = r.x.findIndex((x) => x[0] === s[0]);
      h += '<div class="mut">' + esc(s[0]) + " (chars " + esc(s[1]) + "–" + esc(s[1] + s[2].length) + (s[4] ? ", " + esc(s[4]) : "") +
        ')</div><div class="snip" id="fsn-' + i + '">' +
        marked(s[2], s[3]) + "</div>";
    }
  }
  if ((r.sn || []).length) {
    h += "<h3>Source text</h3>";
    for (const s of r.sn) {
      h += '<div class="mut">' + esc(s[0]) + " (chars " + esc(s[1]) + "–" + esc(s[1] + s[2].length) + (s[4] ? ", " + esc(s[4]) : "") +
        ")</div>" +
        '<div class="snip">' + marked(s[2], s[3]) + "</div>";
    }
  }
  if ((r.st || []).length) {
    h += '<h3>Memory after each step</h3><div class="legend"><ins>added</ins> and <del>removed</del> words against ' +
      "the previous memory; <mark class=gold>gold answer</mark>, <mark class=pred>prediction</mark>" +
      ((r.x || []).length ? ", <mark class=fld>extracted value</mark>" : "") + "</div>";
  }
  let j = 0, prev = "", si = 0;
  for (const s of r.st || []) {
    const pf = (r.pf || [])[si++];  // [prompt tokens, of them reused by the engine's prefix cache]
    const prefill = pf ? "prompt " + esc(pf[0]) + " tokens (" + esc(pf[1]) + " reused) · " : "";
    const isMem = s[1] === "m", hj = isMem ? held[j++] === "1" : false;
    const c = ["step", hj ? "held" : "", s[0] === ev ? "ev" : "", s[0] === r.l ? "lost" : ""].join(" ");
    let badges = "";
    if (s[0] === r.f) badges += '<span class="badge b-found">gold answer found</span>';
    if (s[0] === r.l) badges += '<span class="badge b-lost">gold answer lost</span>';
    if (s[0] === ev) badges += '<span class="badge b-ev">evidence: prediction first in memory</span>';
    for (const x of r.x || []) if (x[2] === s[0] && isMem) badges += '<span class="badge b-fld">' + esc(x[0]) + " first in memory</span>";
    if (!isMem) badges += '<span class="badge b-ans">answer</span>';
    const span = s[2] == null ? "" : " · chars " + esc(s[2]) + "–" + esc(s[3]);
    h += '<div class="' + c + '" id="step-' + esc(s[0]) + '"><div class="hd">step ' + esc(s[0]) + (isMem ? " · memory update" : " · final answer") +
      span + " · " + prefill + (s[4] == null ? "" : esc(s[4]) + " tokens · ") +
      (s[5] === "length" ? '<span class="warn">cut at the token budget</span>' : esc(s[5])) + badges + '</div><div class="mem">';
    if (isMem) { h += diffHtml(prev, s[6] || "", s[7] || [], nd); prev = s[6] || ""; }
    else h += s[6] != null ? hl(s[6], nd) : '<span class="mut">reads the memory above</span>';
    h += "</div></div>";
  }
  if (r.rs != null) h += "<h3>Final response</h3><pre>" + hl(r.rs, nd) + "</pre>";
  el.innerHTML = h;
  for (const a of el.querySelectorAll(".fgo")) {
    a.addEventListener("click", (e) => {
      e.preventDefault();  // in-page: the hash keeps the row
      const t = document.getElementById(a.dataset.snip);
      if (t) { t.scrollIntoView(); t.classList.add("flash"); setTimeout(() => t.classList.remove("flash"), 1500); }
    });
  }
  for (const a of el.querySelectorAll(".seg")) {
    a.addEventListener("click", (e) => {
      e.preventDefault();
      const t = document.getElementById("step-" + a.dataset.step);
      if (t) t.scrollIntoView();
    });
  }
  el.scrollTop = 0;
}

function route() {
  const hs = location.hash.slice(1);
  if (hs.startsWith("row=")) {
    showRow(decodeURIComponent(hs.slice(4))); draw();
    return;
  }
  $("#detail").innerHTML = "";
  if (hs.startsWith("filter=")) {
    const p = new URLSearchParams(hs.slice(7));
    for (const k of ["q", "status", "method", "task", "length", "err"]) st[k] = p.get(k) || "";
    st.fld = p.get("field") || ""; st.val = p.get("value");
    for (const k of ["status", "method", "task", "length"]) { const s = $("#f-" + k); if (s) s.value = st[k]; }
    $("#fq").value = st.q; st.page = 0; draw(); $("#table").scrollIntoView();
  }
}
// Records view (record types): one type at a time, sortable and filterable; a selected record
// shows its snippets with its spans marked. State lives in the hash: #records=type=..&q=..&sort=..&dir=..&doc=..&i=..
const RT = D.records || [], rs = {type: 0, q: "", sort: "", dir: 1, doc: null, i: null};
const RCOLS = (t) => [["id", (r) => r.d], ["#", (r) => r.i]].concat(t.cols.map((c, j) => [c, (r) => r.v[j]]),
  [["mentions", (r) => r.m], ["conflicts", (r) => (r.cf || []).length], ["first chunk", (r) => r.fc],
   ["last chunk", (r) => r.lc]]);
function recHash(ch) {
  const p = new URLSearchParams(), t = RT[rs.type], n = Object.assign({}, rs, ch);
  p.set("type", t ? t.name : "");
  if (n.q) p.set("q", n.q);
  if (n.sort !== "") { p.set("sort", n.sort); p.set("dir", String(n.dir)); }
  if (n.doc != null) { p.set("doc", n.doc); p.set("i", String(n.i)); }
  location.hash = "records=" + p.toString();
}
function recRows(t) {
  const q = rs.q.toLowerCase(), cols = RCOLS(t);
  let out = t.rows.filter((r) => !q || cols.map((c) => String(c[1](r) == null ? "" : c[1](r))).join("\u0001").toLowerCase().includes(q));
  const c = cols.find((x) => x[0] === rs.sort);
  if (c) {
    out = out.slice().sort((a, b) => {
      const x = c[1](a), y = c[1](b);
      if (x == null) return y == null ? 0 : 1;
      if (y == null) return -1;
      return (typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y))) * rs.dir;
    });
  }
  return out;
}
function recSnippet(s) {
  const text = String(s[1]);
  let h = "", at = 0;
  for (const m of (s[2] || []).slice().sort((a, b) => a[0] - b[0])) {
    const a = Math.max(Number(m[0]) || 0, at), e = Math.max(Number(m[1]) || 0, a);
    h += esc(text.slice(at, a)) + '<mark class="fld rec" title="' + esc(m[2]) + '">' + esc(text.slice(a, e)) + "</mark>";
    at = e;
  }
  return '<div class="snip"><span class="mut">@' + esc(s[0]) + (s[3] ? ", " + esc(s[3]) : "") + ": </span>" + h +
    esc(text.slice(at)) + "</div>";
}
function recDraw() {
  const t = RT[rs.type];
  if (!t) return;
  $("#rec-nav").innerHTML = RT.map((x, j) => '<a href="#" data-t="' + esc(j) + '"' + (j === rs.type ? ' class="sel"' : "") +
    ">" + esc(x.name) + " (" + esc(x.total) + ")</a>").join(" · ");
  const cols = RCOLS(t), rows = recRows(t);
  $("#rec-filters").innerHTML = '<input type="search" id="rq" placeholder="filter records" value="' + esc(rs.q) +
    '"> <span id="rec-count" class="mut">' + esc(rows.length) + " of " + esc(t.rows.length) + " records</span>";
  $("#rec-table thead").innerHTML = "<tr>" + cols.map((c) => '<th data-c="' + esc(c[0]) + '"' +
    (c[0] === rs.sort ? ' class="sorted' + (rs.dir < 0 ? " desc" : "") + '"' : "") + ">" + esc(c[0]) + "</th>").join("") + "</tr>";
  $("#rec-table tbody").innerHTML = rows.slice(0, 500).map((r) => '<tr data-doc="' + esc(r.d) + '" data-i="' + esc(r.i) + '"' +
    (r.d === rs.doc && String(r.i) === String(rs.i) ? ' class="sel"' : "") + ">" +
    cols.map((c) => "<td>" + esc(c[1](r)) + "</td>").join("") + "</tr>").join("");
  const cur = t.rows.find((r) => r.d === rs.doc && String(r.i) === String(rs.i));
  $("#rec-detail").innerHTML = !cur ? "" : "<h3>" + esc(t.name) + " " + esc(cur.i) + " of document " + esc(cur.d) +
    "</h3>" + (cur.sn.length ? cur.sn.map(recSnippet).join("") : '<p class="mut">no span of this record was found in the document</p>') +
    ((cur.cf || []).length ? '<p class="mut">conflicts: other mentions stated</p><ul>' + cur.cf.map((c) => "<li>" + esc(c[0]) +
      " = " + esc(c[1]) + (c[2] == null ? "" : " (step " + esc(c[2]) + ")") + "</li>").join("") + "</ul>" : "");
  const q = $("#rq");
  q.addEventListener("change", (e) => recHash({q: e.target.value}));
}
function recSetup() {
  if (!RT.length) return;
  $("#rec-nav").addEventListener("click", (e) => {
    const a = e.target.closest("a[data-t]");
    if (a) { e.preventDefault(); rs.type = Number(a.dataset.t); recHash({q: "", sort: "", doc: null}); }
  });
  $("#rec-table thead").addEventListener("click", (e) => {
    const th = e.target.closest("th[data-c]");
    if (th) recHash({sort: th.dataset.c, dir: rs.sort === th.dataset.c ? -rs.dir : 1});
  });
  $("#rec-table tbody").addEventListener("click", (e) => {
    const tr = e.target.closest("tr[data-doc]");
    if (tr) recHash({doc: tr.dataset.doc, i: tr.dataset.i});
  });
  recRoute();
  window.addEventListener("hashchange", recRoute);
}
function recRoute() {
  if (location.hash.startsWith("#records=")) {
    const p = new URLSearchParams(location.hash.slice(9)), j = RT.findIndex((x) => x.name === p.get("type"));
    rs.type = j < 0 ? 0 : j; rs.q = p.get("q") || ""; rs.sort = p.get("sort") || "";
    rs.dir = p.get("dir") === "-1" ? -1 : 1; rs.doc = p.get("doc"); rs.i = p.get("i");
    recDraw(); $("#records").scrollIntoView();
  } else if (!$("#rec-table tbody").innerHTML) {
    recDraw();
  }
}
// Timings (ms) for the scale benchmark: page start -> table drawn, and the row/filter route.
const t0 = performance.now();
setup(); draw(); recSetup();
const t1 = performance.now();
route();
window.addEventListener("hashchange", route);
document.addEventListener("keydown", (e) => { if (e.key === "Escape" && location.hash.startsWith("#row=")) location.hash = ""; });
const b = document.body.dataset;
b.tableMs = (t1 - t0).toFixed(1); b.routeMs = (performance.now() - t1).toFixed(1);
b.readyMs = performance.now().toFixed(1); b.ready = "1";
})();
