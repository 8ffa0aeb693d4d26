/* Search on a site opened from disk (file://). The theme's search runs in a Web Worker, and
   browsers refuse to start a worker from a file:// page; Material's offline plugin would load
   the "iframe-worker" shim from a CDN for that. This is the same idea in a few lines, served
   from the site itself: under file:// the worker's script runs in a hidden same-origin iframe,
   and messages are passed as events. Over http(s) nothing is changed. */
(function () {
  if (location.protocol !== "file:") return;
  function FileWorker(url) {
    var self = this, target = new EventTarget(), queue = [], ready = false;
    var frame = document.createElement("iframe");
    frame.hidden = true;
    frame.setAttribute("aria-hidden", "true");
    (document.body || document.documentElement).appendChild(frame);
    var win = frame.contentWindow, doc = frame.contentDocument;
    var base = new URL(url, location.href).href;
    win.postMessage = function (data) {           // the worker answers: a message event here
      var ev = new MessageEvent("message", { data: data });
      if (typeof self.onmessage === "function") self.onmessage(ev);
      target.dispatchEvent(ev);
    };
    win.importScripts = function () {              // in order, one after the other
      Array.prototype.forEach.call(arguments, function (src) {
        var s = doc.createElement("script");
        s.src = new URL(src, base).href;
        s.async = false;
        doc.head.appendChild(s);
      });
    };
    var script = doc.createElement("script");
    script.src = base;
    script.onload = function () { ready = true; queue.splice(0).forEach(send); };
    doc.head.appendChild(script);
    function send(data) { win.dispatchEvent(new win.MessageEvent("message", { data: data })); }
    this.postMessage = function (data) { if (ready) send(data); else queue.push(data); };
    this.addEventListener = target.addEventListener.bind(target);
    this.removeEventListener = target.removeEventListener.bind(target);
    this.terminate = function () { frame.remove(); };
    this.onmessage = null;
  }
  window.Worker = FileWorker;
})();
