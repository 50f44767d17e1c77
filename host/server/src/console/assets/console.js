// poimen console: the only script. Pages read without it; it refreshes
// the live parts of a page (an element with data-live) in place, every
// few seconds, from the same URL, while the tab is visible.
(function () {
  var live = document.querySelector("[data-live]");
  if (!live || !window.fetch || !window.DOMParser) return;
  var every = parseInt(live.getAttribute("data-live"), 10) || 2000;
  function refresh() {
    if (document.hidden) return setTimeout(refresh, every);
    fetch(window.location.href, { headers: { "X-Poimen-Refresh": "1" }, credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (text) {
        if (text) {
          var doc = new DOMParser().parseFromString(text, "text/html");
          var fresh = doc.querySelector("[data-live]");
          // The page stopped being live (the run ended): show it whole, once.
          if (!fresh) { window.location.reload(); return true; }
          live.innerHTML = fresh.innerHTML;
        }
      })
      .then(function (reloading) { if (!reloading) setTimeout(refresh, every); },
            function () { setTimeout(refresh, every); });
  }
  setTimeout(refresh, every);
})();
