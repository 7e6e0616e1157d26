// Opens a ShardScope trace export (trace.json or trace.json.gz) in the Chromium installed
// here, in the two ways Chrome opens a trace, and fails unless both take every event:
//  1. DevTools' own trace engine (models/trace, the Performance panel's parser), fed through
//     DevTools' own gzip detection (Common.Gzip.arrayBufferToString: magic bytes), and its
//     per-thread entries counted against the file's complete ("X") events;
//  2. the Performance panel's "Load profile…" path (TimelinePanel.loadFromFile) with a File
//     typed as the file chooser types it from the name (.gz: application/gzip, which is
//     what makes DevTools inflate it), then a screenshot of the panel.
// chrome://tracing, the old viewer, is gone from current Chromium (156 answers ERR_FAILED).
// Run through scripts/check-trace-in-chrome, which installs chromium and puppeteer-core.
//
// Usage: node chrome-trace-check.js TRACE [SCREENSHOT.png]
'use strict';
const fs = require('fs');
const path = require('path');
const zlib = require('zlib');
const puppeteer = require('puppeteer-core');

async function main() {
  const [file, shot] = process.argv.slice(2);
  if (!file) throw new Error('usage: chrome-trace-check.js TRACE [SCREENSHOT.png]');
  const bytes = fs.readFileSync(file);
  const gzipped = bytes.length >= 2 && bytes[0] === 0x1f && bytes[1] === 0x8b;
  // What the file holds, read here with Node's zlib: what Chrome must show.
  const doc = JSON.parse((gzipped ? zlib.gunzipSync(bytes) : bytes).toString('utf8'));
  const events = Array.isArray(doc) ? doc : doc.traceEvents;
  const complete = events.filter((e) => e.ph === 'X');
  const threadsWithSpans = new Set(complete.map((e) => `${e.pid}:${e.tid}`));
  const expected = {events: events.length, complete: complete.length, threads: threadsWithSpans.size};

  const executablePath = process.env.CHROMIUM || '/usr/bin/chromium';
  const browser = await puppeteer.launch({
    executablePath, headless: true, defaultViewport: {width: 1600, height: 900},
    args: ['--no-sandbox', '--disable-gpu', '--enable-unsafe-swiftshader'],
  });
  try {
    const version = await browser.version();
    const page = await browser.newPage();
    await page.goto('devtools://devtools/bundled/trace_app.html', {waitUntil: 'load'});
    const b64 = bytes.toString('base64');
    const mime = file.endsWith('.gz') ? 'application/gzip' : 'application/json';

    // 1. The trace engine, as DevTools parses a trace.
    const parsed = await page.evaluate(async (b64) => {
      const Trace = await import('./models/trace/trace.js');
      const Common = await import('./core/common/common.js');
      const bin = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
      const text = await Common.Gzip.arrayBufferToString(bin.buffer);
      const json = JSON.parse(text);
      const model = Trace.TraceModel.Model.createWithAllHandlers();
      await model.parse(Array.isArray(json) ? json : json.traceEvents,
                        {metadata: {}, isFreshRecording: false});
      const data = model.parsedTrace(0).data;
      let threads = 0, entries = 0;
      const names = [];
      for (const [, proc] of data.Renderer.processes)
        for (const [, thread] of proc.threads) {
          const n = (thread.entries || []).length;
          if (n) { ++threads; entries += n; }
          if (names.length < 8 && thread.name) names.push(thread.name);
        }
      return {gzip: Common.Gzip.isGzip(bin.buffer), threads, entries, names,
              rangeMs: data.Meta.traceBounds.range / 1000};
    }, b64);

    // 2. The Performance panel's Load profile.
    const loaded = await page.evaluate(async (b64, name, mime) => {
      const UI = await import('./ui/legacy/legacy.js');
      const Timeline = await import('./panels/timeline/timeline.js');
      await UI.ViewManager.ViewManager.instance().showView('timeline');
      const bin = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
      const panel = Timeline.TimelinePanel.TimelinePanel.instance();
      const done = new Promise((resolve) => {
        panel.addEventListener('RecordingCompleted', (ev) => resolve(ev.data), {once: true});
      });
      await panel.loadFromFile(new File([bin], name, {type: mime}));
      const result = await done;
      if (result.errorText) return {error: result.errorText};
      const data = panel.model.parsedTrace(result.traceIndex).data;
      let entries = 0;
      for (const [, proc] of data.Renderer.processes)
        for (const [, thread] of proc.threads) entries += (thread.entries || []).length;
      return {error: null, entries, hasTrace: panel.hasActiveTrace()};
    }, b64, path.basename(file), mime);
    if (shot) {
      await new Promise((r) => setTimeout(r, 2000));
      await page.screenshot({path: shot});
    }

    console.log(`Chromium ${version}: ${file} (${bytes.length} bytes, ${gzipped ? 'gzip' : 'plain'})`);
    console.log(`  file: ${expected.events} events, ${expected.complete} complete spans on ${expected.threads} threads`);
    console.log(`  DevTools trace engine: gzip detected ${parsed.gzip}, ${parsed.entries} entries on ${parsed.threads} threads ` +
                `(${parsed.names.join(', ')}${parsed.names.length === 8 ? ', ...' : ''}), ${parsed.rangeMs.toFixed(1)} ms long`);
    console.log(`  Performance panel, Load profile as ${mime}: ` +
                (loaded.error ? `error: ${loaded.error}`
                              : `${loaded.entries} entries, ${loaded.hasTrace ? 'trace shown' : 'no trace shown'}`) +
                (shot ? `, screenshot ${shot}` : ''));
    const ok = parsed.gzip === gzipped && parsed.entries === expected.complete &&
               parsed.threads === expected.threads && !loaded.error && loaded.hasTrace &&
               loaded.entries === expected.complete;
    console.log(ok ? 'OK: Chrome opens it and shows every span' : 'FAILED: Chrome does not show the whole trace');
    return ok;
  } finally {
    await browser.close();
  }
}

main().then((ok) => process.exit(ok ? 0 : 1), (e) => {
  console.error(`chrome-trace-check: ${e.message}`);
  process.exit(2);
});
