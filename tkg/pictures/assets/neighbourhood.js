// The neighbourhood page's one script. tkg/pictures/page.py inlines it as it is and admits it by its SHA-256 in
// the page's Content-Security-Policy, so an edit here needs nothing else. It reads the data from the JSON element
// and builds the SVG with createElementNS and textContent only: strings from memory are never parsed as HTML.
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("tkg-data").textContent);
  var svg = document.getElementById("graph");
  var NS = svg.namespaceURI;
  var panel = document.getElementById("details");
  var R = 18;
  function el(name, attrs, parent) {
    var node = document.createElementNS(NS, name);
    Object.keys(attrs).forEach(function (k) { node.setAttribute(k, String(attrs[k])); });
    if (parent) { parent.appendChild(node); }
    return node;
  }
  function show(title, rows, target) {
    panel.replaceChildren();
    var h = document.createElement("h2"); h.textContent = title; panel.appendChild(h);
    var dl = document.createElement("dl");
    rows.forEach(function (row) {
      var dt = document.createElement("dt"); dt.textContent = row[0]; dl.appendChild(dt);
      var dd = document.createElement("dd"); dd.textContent = row[1] === null || row[1] === "" ? "-" : row[1];
      dl.appendChild(dd);
    });
    panel.appendChild(dl);
    svg.querySelectorAll(".selected").forEach(function (s) { s.classList.remove("selected"); });
    target.classList.add("selected");
  }
  var byId = {};
  data.nodes.forEach(function (n) { byId[n.id] = n; });
  svg.setAttribute("viewBox", data.view.join(" "));
  var defs = el("defs", {}, svg);
  var marker = el("marker", {id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7,
    markerHeight: 7, orient: "auto-start-reverse"}, defs);
  el("path", {d: "M0 0 L10 5 L0 10 z", fill: "#6b7a90"}, marker);
  var edgeLayer = el("g", {"class": "edges"}, svg);
  var nodeLayer = el("g", {"class": "nodes"}, svg);
  function curve(e) {
    var a = byId[e.source], b = byId[e.target];
    if (a === b) {
      var s = 26 + 14 * e.bend;
      return {d: "M" + (a.x - 8) + " " + (a.y - R + 2) + " C" + (a.x - s) + " " + (a.y - R - 2 * s) + " " +
        (a.x + s) + " " + (a.y - R - 2 * s) + " " + (a.x + 8) + " " + (a.y - R + 2), x: a.x, y: a.y - R - 1.5 * s};
    }
    var dx = b.x - a.x, dy = b.y - a.y, len = Math.hypot(dx, dy) || 1;
    var cx = (a.x + b.x) / 2 - dy / len * e.bend * 2, cy = (a.y + b.y) / 2 + dx / len * e.bend * 2;
    var sx = cx - a.x, sy = cy - a.y, sl = Math.hypot(sx, sy) || 1;
    var tx = b.x - cx, ty = b.y - cy, tl = Math.hypot(tx, ty) || 1;
    var x1 = a.x + sx / sl * R, y1 = a.y + sy / sl * R, x2 = b.x - tx / tl * (R + 2), y2 = b.y - ty / tl * (R + 2);
    return {d: "M" + x1 + " " + y1 + " Q" + cx + " " + cy + " " + x2 + " " + y2,
      x: 0.25 * a.x + 0.5 * cx + 0.25 * b.x, y: 0.25 * a.y + 0.5 * cy + 0.25 * b.y};
  }
  data.edges.forEach(function (e) {
    var a = byId[e.source], b = byId[e.target], c = curve(e);
    var g = el("g", {"class": "edge " + e.status, "data-fact": e.id, tabindex: 0}, edgeLayer);
    var times = [["valid_at", e.valid_at], ["invalid_at", e.invalid_at], ["created_at", e.created_at],
      ["expired_at", e.expired_at]];
    el("title", {}, g).textContent = e.fact + "\n" + times.map(function (t) {
      return t[0] + ": " + (t[1] === null ? "-" : t[1]);
    }).join("\n");
    el("path", {"class": "hit", d: c.d}, g);
    el("path", {"class": "line", d: c.d, "marker-end": "url(#arrow)"}, g);
    el("text", {x: c.x, y: c.y - 3}, g).textContent = e.relation;
    var open = function () {
      show(e.fact, [["relation", e.relation], ["from", a.name], ["to", b.name], ["status", e.status]]
        .concat(times, [["id", e.id]]), g);
    };
    g.addEventListener("click", open);
    g.addEventListener("keydown", function (ev) { if (ev.key === "Enter") { open(); } });
  });
  data.nodes.forEach(function (n) {
    var g = el("g", {"class": "node hop" + n.hop, "data-entity": n.id, tabindex: 0}, nodeLayer);
    el("title", {}, g).textContent = n.name + (n.labels.length ? " (" + n.labels.join(", ") + ")" : "");
    el("circle", {cx: n.x, cy: n.y, r: R}, g);
    el("text", {x: n.x, y: n.y < 0 ? n.y - R - 8 : n.y + R + 14}, g).textContent = n.short;  // outward, off the edges
    var open = function () {
      show(n.name, [["labels", n.labels.join(", ")], ["aliases", n.aliases.join(", ")], ["summary", n.summary],
        ["hops from centre", String(n.hop)], ["id", n.id]], g);
    };
    g.addEventListener("click", open);
    g.addEventListener("keydown", function (ev) { if (ev.key === "Enter") { open(); } });
  });
  // Wheel to zoom, drag to pan: both only move the view box.
  var view = data.view.slice(), drag = null;
  function apply() { svg.setAttribute("viewBox", view.join(" ")); }
  svg.addEventListener("wheel", function (ev) {
    ev.preventDefault();
    var k = ev.deltaY > 0 ? 1.15 : 1 / 1.15, box = svg.getBoundingClientRect();
    var px = view[0] + (ev.clientX - box.left) / box.width * view[2];
    var py = view[1] + (ev.clientY - box.top) / box.height * view[3];
    view = [px - (px - view[0]) * k, py - (py - view[1]) * k, view[2] * k, view[3] * k]; apply();
  }, {passive: false});
  svg.addEventListener("pointerdown", function (ev) { drag = [ev.clientX, ev.clientY, view[0], view[1]]; });
  window.addEventListener("pointerup", function () { drag = null; });
  svg.addEventListener("pointermove", function (ev) {
    if (!drag) { return; }
    var box = svg.getBoundingClientRect();
    view[0] = drag[2] - (ev.clientX - drag[0]) / box.width * view[2];
    view[1] = drag[3] - (ev.clientY - drag[1]) / box.height * view[3]; apply();
  });
  svg.setAttribute("data-drawn", String(data.nodes.length + data.edges.length));
}());
