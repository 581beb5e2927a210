// Drives the web console in Debian's chromium with playwright-core (tests/e2e/test_console_browser.py
// runs it): signs in, prints READY and reads the id of the task the test then creates, watches it
// appear in the live list and its open timeline follow it to the end, reads the failed-over
// timeline, its decisions, the breakers, providers and tenants pages, screenshots each into
// ARTIFACTS, and prints what it saw as one JSON line.
import { createInterface } from "node:readline";
import { chromium } from "playwright-core";

const { CONSOLE_URL, CONSOLE_TOKEN, ARTIFACTS, CHROMIUM } = process.env;
const stdin = createInterface({ input: process.stdin });
const nextLine = () => new Promise((resolve) => stdin.once("line", resolve));
const browser = await chromium.launch({
  executablePath: CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: ["--headless", "--no-sandbox"],
});
const seen = {};
try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
  seen.consoleErrors = []; // script errors and Content-Security-Policy refusals
  page.on("console", (m) => m.type() === "error" && seen.consoleErrors.push(m.text()));
  page.on("pageerror", (e) => seen.consoleErrors.push(String(e)));
  await page.goto(`${CONSOLE_URL}/tasks`);
  seen.loginUrl = new URL(page.url()).pathname; // redirected to the sign-in form
  await page.fill("input[name=token]", CONSOLE_TOKEN);
  await Promise.all([page.waitForURL(/\/tasks/), page.click("button[type=submit]")]);
  // A mark in the page's window: gone if the page is ever reloaded.
  const mark = (name) => page.evaluate((n) => (window.__vidrouteMark = n), name);
  const marked = () => page.evaluate(() => window.__vidrouteMark || "");
  await mark("list");
  let eventStreams = 0;
  page.on("request", (r) => {
    if (/\/tasks\/\d+\/events/.test(r.url())) eventStreams += 1;
  });
  console.log("READY"); // the test creates the task now, and answers its id
  const TASK_ID = (await nextLine()).trim();
  seen.taskId = TASK_ID;
  // The task appears in the open list without a reload: htmx re-reads the rows.
  const row = page.locator(`#task-rows a[href="/tasks/${TASK_ID}"]`);
  await row.waitFor({ timeout: 20000 });
  seen.listKept = await marked();
  await page.screenshot({ path: `${ARTIFACTS}/01-task-list.png`, fullPage: true });

  await row.click();
  await page.waitForURL(new RegExp(`/tasks/${TASK_ID}$`));
  // The open timeline follows the task's events (SSE) to the end, with no reload.
  await mark("timeline");
  seen.liveStates = [];
  const deadline = Date.now() + 60000;
  while (Date.now() < deadline) {
    const state = (await page.locator("#task-state").innerText()).trim();
    if (seen.liveStates.at(-1) !== state) seen.liveStates.push(state);
    if (["SUCCEEDED", "FAILED", "CANCELLED"].includes(state)) break;
    await page.waitForTimeout(100);
  }
  seen.timelineKept = await marked();
  seen.eventStreams = eventStreams;
  await page.goto(`${CONSOLE_URL}/tasks`);
  await row.waitFor();
  seen.listedStates = await page.locator("#task-rows td.state").allInnerTexts();
  // The provider filter: any attempt's provider matches.
  const listed = async (query) => {
    const html = await (await page.request.get(`${CONSOLE_URL}/tasks/rows?${query}`)).text();
    return [...html.matchAll(/href="\/tasks\/(\d+)"/g)].map((m) => m[1]);
  };
  seen.byProvider = {
    first: await listed("provider=self_hosted"),
    second: await listed("provider=runway"),
    none: await listed("provider=google"),
  };

  await row.click();
  await page.waitForURL(new RegExp(`/tasks/${TASK_ID}$`));
  seen.taskState = await page.locator("#task-state").innerText();
  seen.attempts = await page.locator("#attempts tbody tr").evaluateAll((rows) =>
    rows.map((r) => Array.from(r.querySelectorAll("td")).map((td) => td.innerText.trim())),
  );
  seen.timeline = await page.locator("#events tbody tr").evaluateAll((rows) =>
    rows.map((r) => Array.from(r.querySelectorAll("td")).map((td) => td.innerText.trim())),
  );
  const video = page.locator("video");
  seen.videos = await video.count();
  if (seen.videos > 0) {
    const src = await video.first().getAttribute("src");
    const ranged = await page.request.get(`${CONSOLE_URL}${src}`, { headers: { Range: "bytes=0-99" } });
    seen.rangeStatus = ranged.status();
    seen.rangeLength = (await ranged.body()).length;
    seen.contentRange = ranged.headers()["content-range"] || "";
    const get = (range) =>
      page.request.get(`${CONSOLE_URL}${src}`, range ? { headers: { Range: range } } : {});
    const whole = await get(null);
    const suffix = await get("bytes=-10");
    const beyond = await get("bytes=999999999-");
    seen.ranges = {
      whole: [whole.status(), (await whole.body()).length, whole.headers()["accept-ranges"]],
      suffix: [suffix.status(), (await suffix.body()).length, suffix.headers()["content-range"]],
      beyond: [beyond.status(), beyond.headers()["content-range"]],
    };
    // The browser loads the clip itself: its metadata (duration) proves it is playable.
    seen.videoDuration = await video.first().evaluate(
      (v) =>
        new Promise((resolve) => {
          if (v.readyState >= 1) return resolve(v.duration);
          v.addEventListener("loadedmetadata", () => resolve(v.duration), { once: true });
          v.addEventListener("error", () => resolve(-1), { once: true });
          v.load();
        }),
    );
  }
  await page.screenshot({ path: `${ARTIFACTS}/02-timeline-failover.png`, fullPage: true });

  await page.click(`a[href="/tasks/${TASK_ID}/decisions"]`);
  await page.waitForURL(/\/decisions$/);
  seen.decisions = await page.locator("section.decision").count();
  seen.explainRows = await page.locator("table.explain tbody tr").evaluateAll((rows) =>
    rows.map((r) => Array.from(r.querySelectorAll("td")).map((td) => td.innerText.trim())),
  );
  seen.explainHeaders = await page.locator("table.explain").first().locator("th").allInnerTexts();
  await page.screenshot({ path: `${ARTIFACTS}/03-decisions.png`, fullPage: true });

  await page.click('a[href="/breakers"]');
  await page.waitForURL(/\/breakers$/);
  seen.breakers = await page.locator("#breakers tbody tr").evaluateAll((rows) =>
    rows.map((r) => Array.from(r.querySelectorAll("td")).map((td) => td.innerText.trim())),
  );
  seen.breakerHistory = await page.locator("#breaker-history tbody tr").evaluateAll((rows) =>
    rows.map((r) => Array.from(r.querySelectorAll("td")).map((td) => td.innerText.trim())),
  );
  await page.screenshot({ path: `${ARTIFACTS}/04-breakers.png`, fullPage: true });
  await page.goto(`${CONSOLE_URL}/breakers?provider=runway`);
  seen.runwayBreakers = await page.locator("#breakers tbody tr td:first-child").allInnerTexts();
  seen.runwayHistory = await page.locator("#breaker-history tbody tr td:nth-child(2)").allInnerTexts();

  await page.click('a[href="/providers"]');
  await page.waitForURL(/\/providers$/);
  seen.healthRows = await page.locator("#health tbody tr").count();
  await page.screenshot({ path: `${ARTIFACTS}/05-providers.png`, fullPage: true });

  await page.click('a[href="/tenants"]');
  await page.waitForURL(/\/tenants$/);
  const acme = page.locator('#tenants tbody tr[data-tenant="acme"]');
  seen.tenantClasses = await acme.evaluateAll((rows) =>
    rows.map((r) => [r.dataset.class, r.querySelector("td.entitled").innerText.trim()]),
  );
  seen.tenantRate = (await acme.locator("td.rate").allInnerTexts()).join(" ");
  await page.screenshot({ path: `${ARTIFACTS}/06-tenants.png`, fullPage: true });
} finally {
  stdin.close();
  await browser.close();
}
console.log(JSON.stringify(seen));
