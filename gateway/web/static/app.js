// switchboard dashboard: small enhancements only; every page reads and works without this.
"use strict";
document.documentElement.classList.add("js");

document.addEventListener("DOMContentLoaded", () => {
  // Lineage: open or close every node at once.
  const expand = document.getElementById("expand-tree");
  if (expand) {
    expand.addEventListener("click", () => {
      const nodes = document.querySelectorAll("#lineage details");
      const open = expand.dataset.open !== "1";
      nodes.forEach((d) => { d.open = open; });
      expand.dataset.open = open ? "1" : "0";
      expand.textContent = open ? "Collapse all" : "Expand all";
    });
  }
  // Chart: show the hovered bar's figure under the chart.
  const chart = document.getElementById("per-day");
  if (chart) {
    const out = document.createElement("p");
    out.className = "chart-readout";
    out.setAttribute("aria-live", "polite");
    chart.parentNode.appendChild(out);
    chart.addEventListener("mouseover", (e) => {
      const bar = e.target.closest("rect.bar");
      if (bar) out.textContent = `${bar.dataset.day} · ${bar.dataset.platform}: ${bar.dataset.value} messages`;
    });
  }
  // Filters: apply as soon as a menu changes.
  const filters = document.getElementById("filters");
  if (filters) {
    filters.querySelectorAll("select").forEach((s) => s.addEventListener("change", () => filters.submit()));
  }
  // A search hit: bring the message into view.
  const target = document.querySelector(".msg.target");
  if (target) target.scrollIntoView({ block: "center" });
});
