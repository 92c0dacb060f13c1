// ddmq-proxy ops console: reads the /admin JSON endpoints every few seconds and draws tables.
// Everything shown is put into the page as text (textContent, createTextNode, SVG attributes holding
// numbers), never parsed as HTML: keys, bodies and errors come from producers and must not run.
"use strict";
(() => {
  const REFRESH_MS = 3000;
  const PAGE = 20;
  const TOKEN_KEY = "ddmq-admin-token";
  const SVG_NS = "http://www.w3.org/2000/svg";

  const state = {
    group: null,
    blockedOffset: 0,
    blockedTotal: 0,
    deadTopic: null,
    deadCursors: [null], // `after` of each page seen, to step back
    deadStarts: [0], // position of each page's first entry
    deadCount: 0,
    blockedNext: null,
    deadPage: 0,
    deadNext: null,
    keysTopic: null,
    keysState: "",
    keysKey: "",
    keysOffsets: [0], // `offset` of each page seen, to step back
    keysNext: null,
    refreshing: false,
  };
  const $ = (id) => document.getElementById(id);

  class AuthError extends Error {}

  // --- DOM helpers: text only -------------------------------------------------------------------

  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(props || {})) {
      if (name === "className") node.className = value;
      else if (name === "dataset") Object.assign(node.dataset, value);
      else if (name === "title") node.title = value;
      else if (name === "onclick") node.addEventListener("click", value);
      else node.setAttribute(name, value);
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function cell(value, className) {
    return el("td", className ? { className } : {}, value === null || value === undefined ? "–" : value);
  }

  function num(value) {
    return value === null || value === undefined ? "–" : Number(value).toLocaleString("en-US");
  }

  function age(ms) {
    if (ms === null || ms === undefined) return "?";
    if (ms === 0) return "0";
    if (ms < 1000) return `${Math.round(ms)} ms`;
    const s = ms / 1000;
    if (s < 60) return `${s.toFixed(1)} s`;
    const m = Math.floor(s / 60);
    if (m < 60) return `${m} m ${String(Math.floor(s % 60)).padStart(2, "0")} s`;
    return `${Math.floor(m / 60)} h ${String(m % 60).padStart(2, "0")} m`;
  }

  // The one way the console shows a point in time: ISO 8601 in UTC to the second, as the ddmq CLIs do.
  function clock(ms) {
    return ms ? new Date(ms).toISOString().slice(0, 19) + "Z" : "–";
  }

  function rate(perSecond) {
    if (perSecond === null || perSecond === undefined) return "–";
    return perSecond < 10 ? perSecond.toFixed(1) : Math.round(perSecond).toLocaleString("en-US");
  }

  function preview(letter) {
    // Listings cut long values (value_truncated); value_bytes is always the full length.
    if (letter.value_text === null) return `(binary, ${num(letter.value_bytes)} bytes)`;
    const cut = letter.value_truncated || letter.value_text.length > 200;
    return cut ? `${letter.value_text.slice(0, 200)}… (${num(letter.value_bytes)} bytes)` : letter.value_text;
  }

  // --- API --------------------------------------------------------------------------------------

  async function api(path, body) {
    const headers = { Accept: "application/json" };
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) headers.Authorization = `Bearer ${token}`;
    const options = { headers, cache: "no-store" };
    if (body !== undefined) {
      options.method = "POST";
      headers["Content-Type"] = "application/json";
      options.body = JSON.stringify(body);
    }
    const response = await fetch(path, options);
    let data = null;
    try {
      data = await response.json();
    } catch (_) {
      data = null;
    }
    if (response.status === 401) throw new AuthError(data ? data.message : "admin token needed");
    if (!response.ok) throw new Error(data && data.message ? data.message : `HTTP ${response.status} for ${path}`);
    return data;
  }

  const enc = encodeURIComponent;

  // --- rendering --------------------------------------------------------------------------------

  function renderGroups(groups) {
    const select = $("group");
    const names = groups.map((g) => g.group);
    if (!names.includes(state.group)) state.group = names.length ? names[0] : null;
    if (select.options.length !== names.length || names.some((n, i) => select.options[i].value !== n)) {
      select.replaceChildren(...names.map((n) => el("option", { value: n }, n)));
    }
    select.value = state.group || "";
  }

  // --- charts: each topic's last hour, SVG polylines of numbers (no text from producers) ---------

  const CHART_W = 300, CHART_H = 72, CHART_PAD = 3, HOUR_MS = 3600 * 1000;

  function svgNode(tag, attrs) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, value);
    return node;
  }

  // One chart of the last hour up to `now`: `lines` are {name, className, points: [[t, v]]}, a null v
  // being a gap; `format` writes a value.
  function lineChart(id, title, lines, format, now) {
    const t0 = now - HOUR_MS;
    const seen = lines.flatMap((line) => line.points).filter(([t, v]) => v !== null && t >= t0).map(([, v]) => v);
    const top = Math.max(0, ...seen);
    const x = (t) => CHART_PAD + ((t - t0) / HOUR_MS) * (CHART_W - 2 * CHART_PAD);
    const y = (v) => CHART_H - CHART_PAD - (top > 0 ? v / top : 0) * (CHART_H - 2 * CHART_PAD);
    const svg = svgNode("svg", { class: "chart", viewBox: `0 0 ${CHART_W} ${CHART_H}`, preserveAspectRatio: "none" });
    for (const line of lines) {
      let run = [];
      const flush = () => {
        // A point alone (no neighbour before a gap) is a dot, so a first sample shows too.
        if (run.length > 1) svg.append(svgNode("polyline", { class: line.className, points: run.map((p) => p.join(",")).join(" ") }));
        else if (run.length === 1) svg.append(svgNode("circle", { class: line.className, cx: run[0][0], cy: run[0][1], r: 1.5 }));
        run = [];
      };
      for (const [t, v] of line.points) {
        if (v === null || t < t0) flush();
        else run.push([x(t).toFixed(1), y(v).toFixed(1)]);
      }
      flush();
    }
    const tooltip = svgNode("title", {});
    tooltip.textContent = `${title}: the last hour, highest ${format(top)}`;
    svg.append(tooltip);
    const last = (line) => {
      const found = line.points.filter(([, v]) => v !== null);
      return found.length ? found[found.length - 1][1] : null;
    };
    const legend = lines.map((line) => el("span", { className: "key " + line.className }, `${line.name} ${format(last(line))}`));
    return el(
      "div",
      { className: "chart-card", dataset: { chart: id } },
      el("div", { className: "chart-title" }, title, el("span", { className: "muted small top" }, `max ${format(top)}`)),
      svg,
      el("div", { className: "axis" }, el("span", {}, "1 h ago"), el("span", {}, "now")),
      el("div", { className: "legend" }, ...legend),
    );
  }

  // Messages a second between consecutive samples of a running total (index `at` of each sample).
  function perSecond(samples, at) {
    const points = [];
    for (let i = 1; i < samples.length; i++) {
      const seconds = (samples[i][0] - samples[i - 1][0]) / 1000;
      if (seconds > 0) points.push([samples[i][0], Math.max(0, samples[i][at] - samples[i - 1][at]) / seconds]);
    }
    return points;
  }

  function topicCharts(topic, samples, local, intervalMs) {
    const now = Math.max(samples.length ? samples[samples.length - 1][0] : 0, local.length ? local[local.length - 1][0] : 0);
    const column = (rows, at) => rows.map((row) => [row[0], row[at]]);
    const rates = (value) => (value === null ? "–" : rate(value) + "/s");
    const cards = [
      lineChart("rates", "in / out, messages a second", [
        { name: "in", className: "rate-in", points: perSecond(samples, 3) },
        { name: "out", className: "rate-out", points: perSecond(samples, 4) },
      ], rates, now),
      lineChart("lag", "lag, messages", [{ name: "now", className: "msgs", points: column(samples, 1) }], num, now),
      lineChart("age", "lag, time", [{ name: "now", className: "age", points: column(samples, 2) }], age, now),
      lineChart("e2e", "produce to ack (this proxy)", [
        { name: "p50", className: "p50", points: column(local, 5) },
        { name: "p99", className: "p99", points: column(local, 6) },
      ], (v) => (v === null ? "–" : age(v)), now),
      lineChart("keys", "keys by state (this proxy)", KEY_STATES.map((name, i) => (
        { name: name.replace("_", " "), className: "state-" + name, points: column(local, i + 1) })), num, now),
      lineChart("dead", "dead letters", [{ name: "now", className: "dead-line", points: column(samples, 5) }], num, now),
    ];
    const note = samples.length < 2
      ? el("span", { className: "muted small" }, ` collecting, one sample every ${intervalMs / 1000} s`) : null;
    return el("div", { className: "topic-charts", dataset: { topic } }, el("h3", {}, topic, note),
      el("div", { className: "chart-grid" }, ...cards));
  }

  function renderCharts(detail, history) {
    const blocks = detail.topics.map((t) => topicCharts(
      t.topic, history.topics[t.topic] || [], (history.local || {})[t.topic] || [], history.interval_ms));
    $("charts").replaceChildren(...blocks);
  }

  // A histogram's p50 / p99 (seconds, from the admin view): "–" before its first observation.
  function quantiles(figures) {
    if (!figures || !figures.count) return "–";
    return `${age(figures.p50 * 1000)} / ${age(figures.p99 * 1000)}`;
  }

  // Keys at their key_buffer cap and the messages they left in Redis (null: a queue another proxy reads).
  function atCap(keys, held) {
    if (keys === null || keys === undefined) return cell(null, "num at-cap");
    return cell(`${num(keys)} / ${num(held)}`, "num at-cap" + (keys > 0 ? " behind" : ""));
  }

  function renderTopics(detail, history) {
    const rows = detail.topics.map((t) => {
      const rates = (history.rates || {})[t.topic] || null;
      const dead = (detail.dead_letters || {})[t.topic];
      const queues = detail.queues.filter((q) => q.topic === t.topic);
      const lag = queues.reduce((sum, q) => sum + q.lag, 0);
      const ages = queues.map((q) => q.lag_ms).filter((v) => v !== null);
      const timeLag = ages.length ? Math.max(...ages) : null;
      const expired = queues.reduce((sum, q) => sum + q.expired, 0);
      const holder = (detail.retention || []).find((h) => h.topic === t.topic);
      return el(
        "tr",
        { dataset: { topic: t.topic } },
        // A breaker that holds the topic shows beside its name (text only, like every cell).
        t.breaker === "open" || t.breaker === "half_open"
          ? cell(`${t.topic} [breaker ${t.breaker === "open" ? "open" : "half-open"}]`, "bad breaker") : cell(t.topic),
        cell(num(t.queues), "num"),
        cell(rate(rates && rates.produced_per_s), "num rate-in"),
        cell(rate(rates && rates.consumed_per_s), "num rate-out"),
        cell(num(lag), "num lag" + (lag > 0 ? " behind" : "")),
        cell(age(timeLag), "num age"),
        cell(quantiles(t.end_to_end && t.end_to_end.delivered), "num e2e"),
        cell(quantiles(t.end_to_end && t.end_to_end.acked), "num e2e"),
        cell(`${num(t.in_flight)} / ${num(t.ready)} / ${num(t.retry_wait)}`, "num jobs"),
        atCap(t.keys_at_cap, t.held_in_redis),
        cell(num(dead), "num dead" + (dead > 0 ? " bad" : "")),
        cell(t.held.length ? `${t.held.length} of ${t.queues}` : "none", "num"),
        cell(num(queues.reduce((sum, q) => sum + q.stored, 0)), "num stored"),
        cell(num(expired), "num expired" + (expired > 0 ? " bad" : "")),
        cell(holder ? `${holder.group}: ${num(holder.retained)} msgs, oldest ${holder.oldest_ms ? age(Date.now() - holder.oldest_ms) : "?"}` : "-", "retention"),
      );
    });
    $("topics").tBodies[0].replaceChildren(...rows);
    const memory = detail.redis_memory;
    const mib = (bytes) => `${(bytes / 1048576).toFixed(1)} MiB`;
    $("memory").textContent = !memory ? "" : memory.max_bytes
      ? `Redis memory: ${mib(memory.used_bytes)} of ${mib(memory.max_bytes)} (${Math.round((100 * memory.used_bytes) / memory.max_bytes)} %)`
      : `Redis memory: ${mib(memory.used_bytes)} (no maxmemory)`;
  }

  function renderTenants(detail) {
    // Only topics with fair_key have tenants (null otherwise): the section shows when one does.
    const rows = [];
    for (const t of detail.topics) {
      for (const row of t.tenants || []) {
        rows.push(el(
          "tr",
          { dataset: { topic: t.topic, tenant: row.tenant } },
          cell(t.topic),
          row.tenant === "" ? cell("(none)", "muted") : cell(row.tenant),
          cell(num(row.in_memory), "num" + (row.in_memory >= row.share ? " behind" : "")),
          cell(num(row.share), "num"),
          cell(num(row.held_keys), "num" + (row.held_keys > 0 ? " behind" : "")),
          cell(String(row.weight), "num"),
        ));
      }
    }
    $("tenants-section").hidden = !detail.topics.some((t) => t.tenants !== null);
    if (!rows.length) rows.push(el("tr", {}, el("td", { colspan: "6", className: "muted" }, "no tenant has messages here")));
    $("tenants").tBodies[0].replaceChildren(...rows);
  }

  function renderQueues(detail) {
    const rows = detail.queues.map((q) =>
      el(
        "tr",
        { dataset: { topic: q.topic, qid: String(q.qid) } },
        cell(q.topic),
        cell(q.qid, "num"),
        cell(q.owner === null ? "no owner" : q.owner, q.owner === null ? "bad" : ""),
        cell(q.term, "num"),
        cell(q.lease_expires_in_ms === null ? null : age(q.lease_expires_in_ms), "num"),
        cell(num(q.committed), "num committed"),
        cell(num(q.produced), "num produced"),
        cell(num(q.lag), "num lag" + (q.lag > 0 ? " behind" : "")),
        cell(age(q.lag_ms), "num age" + (q.lag_ms > 60000 ? " old" : q.lag_ms > 0 ? " behind" : "")),
        cell(num(q.in_flight), "num"),
        cell(num(q.ready), "num"),
        cell(num(q.retry_wait), "num"),
        atCap(q.keys_at_cap, q.held_in_redis),
        cell(num(q.stored), "num stored"),
        cell(num(q.expired), "num expired" + (q.expired > 0 ? " bad" : "")),
      ),
    );
    if (detail.next_queue_offset !== null) {
      // The answer stopped at its byte cap: say so rather than show a table that looks complete.
      const next = detail.next_queue_offset;
      const rest = `${num(next)} queues shown; the rest: /admin/groups/${state.group}?queue_offset=${next}`;
      rows.push(el("tr", {}, el("td", { colspan: "15", className: "muted" }, rest)));
    }
    $("queues").tBodies[0].replaceChildren(...rows);
  }

  function renderMembers(detail) {
    const rows = Object.entries(detail.members)
      .sort()
      .map(([instance, ms]) => {
        const expired = ms > detail.member_ttl_ms;
        return el(
          "tr",
          { dataset: { member: instance } },
          cell(instance),
          cell(`${age(ms)} ago`, "num"),
          el("td", {}, el("span", { className: "badge " + (expired ? "expired" : "live") }, expired ? "expired" : "live")),
        );
      });
    if (!rows.length) rows.push(el("tr", {}, el("td", { colspan: "3", className: "muted" }, "no members")));
    $("members").tBodies[0].replaceChildren(...rows);
  }

  function renderClients(answer) {
    const rows = answer.clients.map((c) =>
      el(
        "tr",
        { dataset: { peer: c.peer } },
        cell(c.peer, "mono"),
        cell(c.protocol),
        cell(c.version === null ? "–" : c.version, "mono version"),
        cell(clock(c.last_pull_ms), "last-pull"),
        cell(num(c.pulls), "num"),
        cell(num(c.in_flight), "num in-flight"),
      ),
    );
    if (answer.total > answer.clients.length) {
      rows.push(el("tr", {}, el("td", { colspan: "6", className: "muted" }, `${answer.clients.length} of ${num(answer.total)} shown`)));
    }
    if (!rows.length) rows.push(el("tr", {}, el("td", { colspan: "6", className: "muted" }, "no client has pulled lately")));
    $("clients").tBodies[0].replaceChildren(...rows);
  }

  function pagerRange(pager, first, count, total) {
    pager.querySelector(".range").textContent =
      total === 0 ? "none" : `${num(first + 1)}–${num(first + count)} of ${num(total)}`;
  }

  function renderBlocked(blocked) {
    state.blockedTotal = blocked.total;
    if (blocked.offset > 0 && blocked.offset >= blocked.total) state.blockedOffset = 0; // drained: back to the top
    const rows = blocked.keys.map((k) =>
      el(
        "tr",
        { dataset: { key: k.order_key } },
        cell(k.order_key, "mono key"),
        cell(k.topic),
        cell(k.head.qid, "num"),
        cell(num(k.head.offset), "num"),
        cell(k.state.replace("_", " "), "state state-" + k.state),
        cell(k.head.attempts, "num"),
        cell(num(k.chain_length), "num"),
        cell(age(k.head_age_ms), "num"),
        cell(k.head.last_error || "", "mono"),
      ),
    );
    if (!rows.length) rows.push(el("tr", {}, el("td", { colspan: "9", className: "muted" }, "no unfinished keys")));
    $("blocked").tBodies[0].replaceChildren(...rows);
    const pager = $("blocked-pager");
    pagerRange(pager, blocked.offset, blocked.keys.length, blocked.total);
    pager.querySelector('[data-step="-1"]').disabled = blocked.offset === 0;
    state.blockedNext = blocked.next_offset;
    pager.querySelector('[data-step="1"]').disabled = blocked.next_offset === null;
  }

  function renderDead(page) {
    // A page may stop early (answers are bounded in bytes): `more` says whether another follows.
    state.deadNext = page.more ? page.next_after : null;
    state.deadCount = page.entries.length;
    const rows = page.entries.map((d) =>
      el(
        "tr",
        { dataset: { id: d.id } },
        cell(d.id, "mono"),
        cell(d.qid, "num"),
        cell(num(d.offset), "num"),
        cell(d.key, "mono key"),
        cell(d.attempts, "num"),
        cell(d.error, "mono"),
        cell(clock(d.dead_ms)),
        el("td", { className: "mono body", title: preview(d) }, preview(d)),
        el(
          "td",
          {},
          el("button", { type: "button", className: "replay", onclick: () => act("replay", { ids: [d.id] }) }, "replay"),
          " ",
          el("button", { type: "button", className: "purge danger", onclick: () => purge([d.id]) }, "purge"),
        ),
      ),
    );
    if (!rows.length) rows.push(el("tr", {}, el("td", { colspan: "9", className: "muted" }, "no dead letters")));
    $("dead").tBodies[0].replaceChildren(...rows);
    const pager = $("dead-pager");
    pagerRange(pager, state.deadStarts[state.deadPage] || 0, page.entries.length, page.total);
    pager.querySelector('[data-step="-1"]').disabled = state.deadPage === 0;
    pager.querySelector('[data-step="1"]').disabled = state.deadNext === null;
    $("replay-all").disabled = $("purge-all").disabled = page.total === 0;
    $("purge-all").dataset.total = String(page.total);
  }

  function renderDeadTopics(detail) {
    const topics = detail.topics.map((t) => t.topic);
    if (!topics.includes(state.deadTopic)) {
      state.deadTopic = topics.length ? topics[0] : null;
      resetDeadPages();
    }
    const select = $("dead-topic");
    if (select.options.length !== topics.length || topics.some((t, i) => select.options[i].value !== t)) {
      select.replaceChildren(...topics.map((t) => el("option", { value: t }, t)));
    }
    select.value = state.deadTopic || "";
  }

  function resetDeadPages() {
    state.deadCursors = [null];
    state.deadStarts = [0];
    state.deadPage = 0;
  }

  const KEY_STATES = ["parked", "failing", "in_flight", "waiting"];
  // What an operator may do to a key in each state (the proxy refuses the rest anyway).
  const KEY_ACTIONS = {
    parked: ["retry", "skip", "resume"],
    failing: ["retry", "skip", "park"],
    in_flight: ["park"],
    waiting: ["park"],
  };

  function stuckFirst(keys) {
    const rank = (k) => (KEY_STATES.includes(k.state) ? KEY_STATES.indexOf(k.state) : KEY_STATES.length);
    return keys.map((k, i) => [k, i]).sort((a, b) => rank(a[0]) - rank(b[0]) || a[1] - b[1]).map((p) => p[0]);
  }

  function renderKeys(answer) {
    const counts = answer.counts || {};
    $("keys-counts").textContent = KEY_STATES.map((s) => `${num(counts[s] || 0)} ${s.replace("_", " ")}`).join(" · ");
    state.keysNext = answer.next_offset === undefined ? null : answer.next_offset;
    const rows = stuckFirst(answer.keys).map((k) =>
      el(
        "tr",
        { dataset: { key: k.key, qid: String(k.qid), state: k.state } },
        cell(k.key, "mono key"),
        cell(k.qid, "num"),
        cell(k.state.replace("_", " "), "state state-" + k.state),
        cell(num(k.head_offset), "num"),
        cell(k.attempts, "num attempts"),
        cell(num(k.waiting), "num"),
        cell(k.parked_by ? `${k.parked_by} ${clock(k.parked_at_ms)}` : "", "parked-by"),
        el("td", { className: "mono reason", title: k.reason || "" }, k.reason || ""),
        el(
          "td",
          { className: "actions" },
          ...(KEY_ACTIONS[k.state] || []).map((action) =>
            el("button", { type: "button", className: action + (action === "skip" ? " danger" : ""),
                           onclick: () => keyAction(action, k) }, action),
          ),
          el("button", { type: "button", className: "explain", onclick: () => explainKey(k) }, "why?"),
        ),
      ),
    );
    if (!rows.length) rows.push(el("tr", {}, el("td", { colspan: "9", className: "muted" }, "no keys")));
    $("keys").tBodies[0].replaceChildren(...rows);
    const pager = $("keys-pager");
    pager.querySelector('[data-step="-1"]').disabled = state.keysOffsets.length < 2;
    pager.querySelector('[data-step="1"]').disabled = state.keysNext === null;
  }

  function renderKeysTopics(detail) {
    const topics = detail.topics.map((t) => t.topic);
    if (!topics.includes(state.keysTopic)) {
      state.keysTopic = topics.length ? topics[0] : null;
      state.keysOffsets = [0];
    }
    const select = $("keys-topic");
    if (select.options.length !== topics.length || topics.some((t, i) => select.options[i].value !== t)) {
      select.replaceChildren(...topics.map((t) => el("option", { value: t }, t)));
    }
    select.value = state.keysTopic || "";
  }

  function keysPath() {
    return `/admin/groups/${enc(state.group)}/topics/${enc(state.keysTopic)}/keys`;
  }

  function keysQuery() {
    const params = new URLSearchParams();
    if (state.keysState) params.set("state", state.keysState);
    if (state.keysKey) params.set("key", state.keysKey);
    const offset = state.keysOffsets[state.keysOffsets.length - 1];
    if (offset) params.set("offset", String(offset));
    const query = params.toString();
    return query ? `?${query}` : "";
  }

  // Why one key is where it is (GET .../keys/explain): a block of text lines per queue.
  async function explainKey(key) {
    const box = $("keys-explain");
    try {
      const params = new URLSearchParams({ key: key.key, qid: String(key.qid) });
      const answer = await api(`${keysPath()}/explain?${params}`);
      box.replaceChildren(...answer.queues.map((q) => {
        const client = q.client ? `${q.client.protocol} ${q.client.peer}${q.client.client_id ? ` (${q.client.client_id})` : ""}` : "";
        const lines = [
          `${answer.key} · qid ${q.qid} · read by ${q.read_by || "no proxy"}: ${String(q.state).replace("_", " ")}` +
            (q.since_ms ? ` since ${clock(q.since_ms)}` : ""),
          q.head_offset === null ? null : `head offset ${q.head_offset}, attempt ${q.attempts} of ${q.max_attempts}; ` +
            `${q.waiting} waiting behind it, ${q.held_in_redis} held in Redis`,
          client ? `held by client ${client} until ${clock(q.deadline_ms)}` : null,
          q.topic_hold ? `topic held: ${q.topic_hold}` : null,
          q.reason ? `reason: ${q.reason}` : null,
          `next: ${q.next}`,
          q.command ? `act: ${q.command}` : null,
        ];
        return el("pre", { className: "explain-queue", dataset: { qid: String(q.qid), state: String(q.state) } },
                  lines.filter((line) => line !== null).join("\n"));
      }));
    } catch (error) {
      box.replaceChildren(el("pre", { className: "explain-queue" }, `explain failed: ${error.message}`));
    }
  }

  async function keyAction(action, key) {
    if (action === "skip") {
      const what = `Skip the head of key ${key.key} (offset ${key.head_offset}) of ${state.group}/${state.keysTopic}?`;
      if (!window.confirm(`${what} It goes to the dead letters and the key moves on.`)) return;
    }
    try {
      const result = await api(`${keysPath()}/${action}`, { key: key.key, qid: key.qid, by: "console" });
      const applied = result.applied || [];
      $("keys-result").textContent = applied.length
        ? `${action} ${key.key}: ${applied.map((a) => `qid ${a.qid} ${String(a.state).replace("_", " ")}`).join(", ")}`
        : `${action} ${key.key}: nothing to do`;
    } catch (error) {
      $("keys-result").textContent = `${action} failed: ${error.message}`;
    }
    await refresh();
  }

  // --- pauses and the record of operator actions ------------------------------------------------

  function pauseRow(topic, pauses) {
    const own = pauses.find((p) => p.topic === topic);
    const everyTopic = topic !== null ? pauses.find((p) => p.topic === null) : undefined;
    const stateText = own ? "paused" : everyTopic ? "paused (every topic)" : "running";
    // A topic under the group's pause is resumed with the group: its own button would change nothing.
    const button = own
      ? el("button", { type: "button", className: "resume", onclick: () => pauseAction("resume", topic) }, "resume")
      : everyTopic
        ? null
        : el("button", { type: "button", className: "pause danger", onclick: () => pauseAction("pause", topic) }, "pause");
    return el(
      "tr",
      { dataset: { topic: topic === null ? "*" : topic } },
      cell(topic === null ? "every topic" : topic),
      cell(stateText, "state" + (own || everyTopic ? " bad" : "")),
      cell(own ? own.by : ""),
      cell(own ? clock(own.at_ms) : ""),
      cell(own ? (own.until_ms === null ? "until resumed" : clock(own.until_ms)) : ""),
      el("td", { className: "actions" }, button),
    );
  }

  function renderPauses(detail, answer) {
    const topics = detail.topics.map((t) => t.topic);
    $("pauses").tBodies[0].replaceChildren(...[null, ...topics].map((topic) => pauseRow(topic, answer.paused)));
  }

  async function pauseAction(what, topic) {
    const scope = topic === null ? `every topic of ${state.group}` : `${state.group}/${topic}`;
    if (what === "pause" && !window.confirm(`Pause ${scope}? Every proxy of the group stops handing out its messages until it is resumed.`)) return;
    const body = topic === null ? { by: "console" } : { topic, by: "console" };
    try {
      const result = await api(`/admin/groups/${enc(state.group)}/${what}`, body);
      $("pause-result").textContent = what === "pause" ? `paused ${scope}` : `resumed ${scope} (${result.lifted} pause(s) lifted)`;
    } catch (error) {
      $("pause-result").textContent = `${what} failed: ${error.message}`;
    }
    await refresh();
  }

  function detailText(detail) {
    const text = Object.entries(detail || {})
      .filter(([, value]) => value !== null && value !== undefined)
      .map(([name, value]) => `${name}=${JSON.stringify(value)}`)
      .join(" ");
    return text.length > 160 ? `${text.slice(0, 159)}…` : text;
  }

  function renderActions(answer) {
    const rows = answer.actions.map((a) =>
      el(
        "tr",
        { dataset: { id: a.id, action: a.action } },
        cell(clock(a.at_ms), "when"),
        cell(a.who, "who"),
        cell(a.action, "what"),
        cell(a.group === null ? "–" : a.topic === null ? a.group : `${a.group}/${a.topic}`, "where"),
        el("td", { className: "mono detail", title: JSON.stringify(a.detail) }, detailText(a.detail)),
      ),
    );
    if (!rows.length) rows.push(el("tr", {}, el("td", { colspan: "5", className: "muted" }, "no operator action recorded")));
    $("actions").tBodies[0].replaceChildren(...rows);
  }

  // --- actions ----------------------------------------------------------------------------------

  function lettersPath() {
    return `/admin/groups/${enc(state.group)}/topics/${enc(state.deadTopic)}/dead-letters`;
  }

  async function act(what, selection) {
    resetDeadPages();
    try {
      const result = await api(`${lettersPath()}/${what}`, selection);
      $("dead-result").textContent =
        what === "replay"
          ? `replayed ${result.replayed}` + (result.missing.length ? `, ${result.missing.length} already gone` : "") +
            ((result.refused || []).length ? `; refused: ${result.refused.map((r) => r.reason).join("; ")}` : "")
          : `purged ${result.purged}`;
    } catch (error) {
      $("dead-result").textContent = `${what} failed: ${error.message}`;
    }
    await refresh();
  }

  async function purge(ids) {
    const what = ids ? `${ids.length} dead letter(s)` : `all ${$("purge-all").dataset.total} dead letters`;
    if (!window.confirm(`Purge ${what} of ${state.group}/${state.deadTopic}? They are deleted for good.`)) return;
    await act("purge", ids ? { ids } : { all: true });
  }

  // --- refresh ----------------------------------------------------------------------------------

  function showError(message) {
    $("error").hidden = !message;
    $("error").textContent = message || "";
  }

  async function refresh() {
    if (state.refreshing) return;
    state.refreshing = true;
    try {
      const groups = await api("/admin/groups");
      $("auth").hidden = true;
      $("forget").hidden = !sessionStorage.getItem(TOKEN_KEY);
      renderGroups(groups.groups);
      if (state.group === null) {
        $("main").hidden = true;
        showError("this proxy serves no group");
        return;
      }
      const g = enc(state.group);
      const [detail, history, blocked, clients, pauses, actions] = await Promise.all([
        api(`/admin/groups/${g}`),
        api(`/admin/groups/${g}/lag-history`),
        api(`/admin/groups/${g}/blocked-keys?limit=${PAGE}&offset=${state.blockedOffset}`),
        api(`/admin/groups/${g}/clients`),
        api(`/admin/groups/${g}/pause`),
        api("/admin/actions?limit=50"),
      ]);
      renderDeadTopics(detail);
      renderKeysTopics(detail);
      let keys = null;
      if (state.keysTopic !== null) keys = await api(keysPath() + keysQuery());
      let page = null;
      if (state.deadTopic !== null) {
        const after = state.deadCursors[state.deadPage];
        page = await api(`${lettersPath()}?limit=${PAGE}` + (after ? `&after=${enc(after)}` : ""));
      }
      renderTopics(detail, history);
      renderTenants(detail);
      renderCharts(detail, history);
      renderQueues(detail);
      renderMembers(detail);
      renderClients(clients);
      renderPauses(detail, pauses);
      renderActions(actions);
      renderBlocked(blocked);
      if (page) renderDead(page);
      if (keys) renderKeys(keys);
      $("main").hidden = false;
      showError(null);
      $("status").textContent = `updated ${clock(Date.now())}`;
    } catch (error) {
      if (error instanceof AuthError) {
        $("main").hidden = true;
        $("auth").hidden = false;
        $("auth-error").textContent = sessionStorage.getItem(TOKEN_KEY) ? "that token was refused" : "";
        $("status").textContent = "admin token needed";
      } else {
        showError(`refresh failed: ${error.message}`);
        $("status").textContent = "refresh failed";
      }
    } finally {
      state.refreshing = false;
    }
  }

  // --- wiring -----------------------------------------------------------------------------------

  function init() {
    fetch("/healthz", { cache: "no-store" })
      .then((r) => r.json())
      .then((h) => ($("instance").textContent = h.instance_id))
      .catch(() => {});
    $("auth-form").addEventListener("submit", (event) => {
      event.preventDefault();
      sessionStorage.setItem(TOKEN_KEY, $("token").value);
      $("token").value = "";
      refresh();
    });
    $("forget").addEventListener("click", () => {
      sessionStorage.removeItem(TOKEN_KEY);
      refresh();
    });
    $("group").addEventListener("change", () => {
      state.group = $("group").value;
      state.blockedOffset = 0;
      state.deadTopic = null;
      state.keysTopic = null;
      refresh();
    });
    $("dead-topic").addEventListener("change", () => {
      state.deadTopic = $("dead-topic").value;
      resetDeadPages();
      refresh();
    });
    $("blocked-pager").addEventListener("click", (event) => {
      const step = Number(event.target.dataset && event.target.dataset.step);
      if (!step) return;
      if (step === 1 && state.blockedNext !== null) state.blockedOffset = state.blockedNext;
      else if (step === -1) state.blockedOffset = Math.max(0, state.blockedOffset - PAGE);
      else return;
      refresh();
    });
    $("dead-pager").addEventListener("click", (event) => {
      const step = Number(event.target.dataset && event.target.dataset.step);
      if (step === 1 && state.deadNext !== null) {
        state.deadCursors[state.deadPage + 1] = state.deadNext;
        state.deadStarts[state.deadPage + 1] = (state.deadStarts[state.deadPage] || 0) + state.deadCount;
        state.deadPage += 1;
      } else if (step === -1 && state.deadPage > 0) {
        state.deadPage -= 1;
      } else {
        return;
      }
      refresh();
    });
    $("keys-topic").addEventListener("change", () => {
      state.keysTopic = $("keys-topic").value;
      state.keysOffsets = [0];
      refresh();
    });
    $("keys-state").addEventListener("change", () => {
      state.keysState = $("keys-state").value;
      state.keysOffsets = [0];
      refresh();
    });
    $("keys-filter").addEventListener("submit", (event) => {
      event.preventDefault();
      state.keysKey = $("keys-key").value;
      state.keysOffsets = [0];
      refresh();
    });
    $("keys-key").addEventListener("search", () => {
      state.keysKey = $("keys-key").value;
      state.keysOffsets = [0];
      refresh();
    });
    $("keys-pager").addEventListener("click", (event) => {
      const step = Number(event.target.dataset && event.target.dataset.step);
      if (step === 1 && state.keysNext !== null) state.keysOffsets.push(state.keysNext);
      else if (step === -1 && state.keysOffsets.length > 1) state.keysOffsets.pop();
      else return;
      refresh();
    });
    $("replay-all").addEventListener("click", () => act("replay", { all: true }));
    $("purge-all").addEventListener("click", () => purge(null));
    setInterval(() => {
      if ($("auto").checked) refresh();
    }, REFRESH_MS);
    refresh();
  }

  init();
})();
