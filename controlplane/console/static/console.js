// Live task timeline: the task's events arrive as server-sent events (/tasks/{id}/events, the
// stream WatchTask serves); each one makes htmx re-read the timeline fragment. The browser's
// EventSource resumes after the last event id on a dropped connection; "end" closes it.
(() => {
  const start = () => {
    const holder = document.querySelector("[data-events]");
    if (!holder || !window.EventSource) return;
    const refresh = () => {
      const timeline = document.getElementById("timeline");
      if (timeline) timeline.dispatchEvent(new CustomEvent("task-event"));
    };
    const source = new EventSource(holder.dataset.events);
    source.addEventListener("task", refresh);
    source.addEventListener("end", () => {
      source.close();
      refresh();
    });
  };
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
