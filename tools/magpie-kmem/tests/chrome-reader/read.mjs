// Loads a Chrome trace-event JSON file with Chrome DevTools' trace engine
// (the Performance panel's reader, npm @paulirish/trace_engine, pinned by
// package-lock.json) and prints what it made of it, as JSON on stdout:
//
//   {"events": N, "generic": true, "bounds": {"min": µs, "max": µs},
//    "processes": {"PID": "name"},
//    "threads": [{"pid": P, "tid": T, "name": "cpu 0",
//                 "entries": [["alloc kmalloc-128", 1.0], ...]}]}
//
// `threads` are the tracks the Performance panel draws for a trace that
// did not come from Chrome ("generic"), each with the events it placed
// on it in time order. Exits non-zero with the engine's error if it
// refuses the file. Usage: node read.mjs TRACE.json
import fs from 'node:fs';
import * as Trace from '@paulirish/trace_engine';

// The engine's geometry helpers expect a browser's DOMRect (its README:
// "To run in Node, you'll need to polyfill window.DOMRect").
globalThis.DOMRect ??= class DOMRect {
  constructor(x = 0, y = 0, width = 0, height = 0) {
    Object.assign(this, {x, y, width, height});
  }
};

const file = process.argv[2];
if (!file) {
  console.error('usage: node read.mjs TRACE.json');
  process.exit(2);
}
const json = JSON.parse(fs.readFileSync(file, 'utf8'));
const model = Trace.TraceModel.Model.createWithAllHandlers();
await model.parse(json.traceEvents ?? json);
const parsed = model.parsedTrace();
const data = parsed.data;
const threads = [];
for (const [pid, process] of data.Renderer.processes) {
  for (const [tid, thread] of process.threads) {
    threads.push({
      pid,
      tid,
      name: thread.name ?? null,
      entries: thread.entries.map(entry => [entry.name, entry.ts]),
    });
  }
}
const processes = {};
for (const [pid, event] of data.Meta.processNames) {
  processes[pid] = event.args.name;
}
console.log(JSON.stringify({
  events: parsed.traceEvents.length,
  generic: data.Meta.traceIsGeneric,
  bounds: {min: data.Meta.traceBounds.min, max: data.Meta.traceBounds.max},
  processes,
  threads,
}));
