// Runs the HTTP WG cache test suite (npm `http-cache-tests`) against a proxy, as the suite's own
// cli.mjs does — the same tests, surrogate-control included, the same runner, every request
// through the proxy (each test's set-up `PUT /config/UUID` too, which the route lets through).
//
// Each request has a connection of its own, as with the Node versions the suite's published
// results were made with (Node 19 made keep-alive the default). On a kept-alive connection, a
// proxy that closes it after an answer without saying `Connection: close` — rangeway does after
// a 502 — makes the client's next request on it fail ("socket hang up"), and which test that hits
// is chance: a flaky failure of an unrelated test, not a measure of it.
//
// usage: node run.mjs PACKAGE_DIR PROXY_URL ORIGIN_URL [--origin-requests FILE] [--id TEST_ID]
// Prints the results JSON (the shape of the package's results/*.json) on stdout. With
// --origin-requests, also writes what the origin received for each test, read from the origin
// itself after the run: {test id: ["METHOD Req-Num field: value ...", ...]}, Req-Num being the
// client's request number the suite sends ("-" when the proxy sent a request of its own).
// With --id, runs that test alone and prints its requests and responses as seen at both ends.
import { writeFileSync } from 'fs'
import { Agent } from 'http'
import { createRequire } from 'module'
import { join } from 'path'
import { pathToFileURL } from 'url'
import { parseArgs } from 'util'

const usage = 'usage: node run.mjs PACKAGE_DIR PROXY_URL ORIGIN_URL [--origin-requests FILE] [--id TEST_ID]'
const { values: options, positionals } = parseArgs({
  allowPositionals: true,
  options: { id: { type: 'string' }, 'origin-requests': { type: 'string' } }
})
const [packageDir, proxyUrl, originUrl] = positionals
if (positionals.length !== 3) {
  console.error(usage)
  process.exit(2)
}
const load = path => import(pathToFileURL(join(packageDir, path)).href)
const fetch = createRequire(join(packageDir, 'package.json'))('node-fetch')
const { runTests, getResults } = await load('client/runner.mjs')
const { testUUIDs } = await load('client/test.mjs')
const display = await load('lib/display.mjs')
const { default: tests } = await load('tests/index.mjs')
const { default: surrogate } = await load('tests/surrogate-control.mjs')
tests.push(surrogate)

const proxyBase = proxyUrl.replace(/\/+$/, '')
const originBase = originUrl.replace(/\/+$/, '')
const connectionPerRequest = new Agent({ keepAlive: false })

function fetchOnItsOwnConnection (url, init) {
  return fetch(url, { ...init, agent: connectionPerRequest })
}

// The request fields that tell a cache's own requests apart: conditions, ranges, credentials.
const tracedFields = ['range', 'if-none-match', 'if-modified-since', 'if-match', 'if-range',
  'if-unmodified-since', 'authorization']

async function originRequests () {
  const trace = {}
  for (const [testId, uuid] of Object.entries(testUUIDs).sort()) {
    const answer = await fetch(`${originBase}/state/${uuid}`, { agent: connectionPerRequest })
    const state = answer.status === 200 ? await answer.json() : []
    trace[testId] = state.map(request => {
      const fields = tracedFields
        .filter(name => name in request.request_headers)
        .map(name => ` ${name}: ${request.request_headers[name]}`)
      return `${request.request_method} ${request.request_num ?? '-'}${fields.join('')}`
    })
  }
  return trace
}

let testsToRun = tests
if (options.id) {
  const suite = tests.find(s => s.tests.some(t => t.id === options.id))
  if (!suite) {
    console.error(`no test ${options.id} in the suite`)
    process.exit(2)
  }
  const test = suite.tests.find(t => t.id === options.id)
  test.dump = true
  testsToRun = [{ ...suite, tests: [test] }]
}

await runTests(testsToRun, fetchOnItsOwnConnection, false, proxyBase)
const results = getResults()
if (options.id) {
  const verdict = display.determineTestResult(tests, options.id, results, false)
  const detail = results[options.id] === true ? '' : results[options.id][1]
  console.log(`==== Result: ${verdict[2]} ${detail}`)
} else {
  console.log(JSON.stringify(results, null, 2))
}
if (options['origin-requests']) {
  writeFileSync(options['origin-requests'], JSON.stringify(await originRequests(), null, 2) + '\n')
}
