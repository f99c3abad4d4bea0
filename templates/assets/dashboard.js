// Live logs for a job page: the page already shows the lines stored so far; this follows
// the job's log websocket from there (the same stream `gpulayer logs --follow` reads) and
// appends each new line, then the job's final state. Everything else works without it.
(function () {
  "use strict";
  var pre = document.getElementById("logs");
  if (!pre || pre.dataset.live !== "true") { return; }
  var status = document.getElementById("logs-status");
  var state = document.getElementById("job-state");
  var url = new URL(pre.dataset.ws, window.location.href);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  // One cursor per task attempt already shown (a multi-node job has a task per node).
  var cursors = {};
  (pre.dataset.after || "").split(",").filter(Boolean).forEach(function (c) {
    var p = c.split(":");
    cursors[p[0] + ":" + p[1]] = p[2];
  });
  function after() {
    return Object.keys(cursors).map(function (k) { return k + ":" + cursors[k]; }).join(",");
  }
  var count = pre.querySelectorAll("span").length;
  function atBottom() { return pre.scrollHeight - pre.scrollTop - pre.clientHeight < 40; }
  function connect() {
    if (after()) { url.searchParams.set("after", after()); }
    var ws = new WebSocket(url.toString());
    ws.onopen = function () { status.textContent = "following live"; };
    ws.onmessage = function (ev) {
      var msg = JSON.parse(ev.data);
      if (msg.type === "line") {
        var follow = atBottom();
        var span = document.createElement("span");
        span.className = msg.stream === "stderr" ? "err" : (msg.stream === "system" ? "sys" : "out");
        span.textContent = (msg.rank !== undefined && msg.rank !== null ? "[rank " + msg.rank + "] " : "") + msg.text;
        pre.appendChild(span);
        pre.appendChild(document.createTextNode("\n"));
        count += 1;
        cursors[msg.task + ":" + msg.attempt] = msg.seq;
        if (follow) { pre.scrollTop = pre.scrollHeight; }
      } else if (msg.type === "end") {
        if (state) { state.textContent = msg.state; state.className = "state " + msg.state; }
        status.textContent = count + " line(s); the job " + msg.state +
          (msg.exit_code !== null && msg.exit_code !== undefined ? " with exit code " + msg.exit_code : "");
        pre.dataset.live = "false";
        ws.close();
      }
    };
    ws.onclose = function () {
      if (pre.dataset.live === "true") {
        status.textContent = "reconnecting…";
        setTimeout(connect, 1000);
      }
    };
  }
  connect();
}());
