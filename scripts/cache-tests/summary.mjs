// Counts the required tests of the HTTP WG cache test suite (npm `http-cache-tests`) that a cache
// passed, beside the results the package ships for other caches, and lists the required tests
// it did not pass, by suite, with what the origin received in each (the .origin-requests.json
// scripts/cache-tests.sh writes beside the results, when there is one). Markdown on stdout
// (docs/cache-tests.md holds a run of it).
//
// usage: node summary.mjs PACKAGE_DIR [LABEL=RESULTS.json ...]
//        node summary.mjs PACKAGE_DIR --passed RESULTS.json
//   The second form prints the ids of the required tests of tests/index.mjs whose own result
//   passed (as issue 44 counts), one per line: what tests/cache_suite.rs holds rangeway to.
//   e.g. node summary.mjs ~/.cache/rangeway/http-cache-tests-0.4.5/node_modules/http-cache-tests \
//          'rangeway, cache off=target/cache-tests/cache-off.json' \
//          'rangeway, cache on=target/cache-tests/cache-on.json'
//
// How a test is counted — as cache-tests.fyi counts it, with the package's own
// lib/display.mjs `determineTestResult`:
// - A test is *required* when its `kind` is `required` or unset: determineTestResult treats both
//   as conformance tests (⛔ when not passed), unlike `optimal` (⚠️) and `check` (Y/N). Tests
//   marked `browser_only` are left out: the CLI never runs them. The suites are those of
//   tests/index.mjs (157 required tests in 0.4.5); the surrogate-control suite, which the CLI and
//   the site add to them, is counted on a line of its own, because issue 44's target and the
//   figures it quotes for other caches count tests/index.mjs alone.
// - A test's verdict is determineTestResult's: its result in the JSON is `true` (passed) or
//   `[error name, message]`. `["Setup", "retry"]` is a retry (↻: the origin saw one client
//   request twice), any other `Setup` error a set-up failure (🔹: something the test relies on,
//   not what it checks, went wrong), and any other error a failure (⛔) — an `Assertion`, or an
//   error of the connection such as a `FetchError`, which this summary counts as errored.
//   A test with `depends_on` whose dependency did not pass is shown ⚪ (dependency failed)
//   whatever its own result: the site does not count it as passed.
// - "passed" is the site's ✅; "passed, own result" counts `true` results ignoring dependencies,
//   which is how issue 44 counts (Squid 134, httpd 124, Traffic Server 119, Varnish 118,
//   nginx 96 of the package's shipped results).
import { existsSync, readFileSync } from 'fs'
import { join } from 'path'
import { pathToFileURL } from 'url'

const [packageDir, ...namedResults] = process.argv.slice(2)
if (!packageDir) {
  console.error('usage: node summary.mjs PACKAGE_DIR [LABEL=RESULTS.json ...]')
  process.exit(2)
}
const load = path => import(pathToFileURL(join(packageDir, path)).href)
const display = await load('lib/display.mjs')
const { default: indexSuites } = await load('tests/index.mjs')
const { default: surrogate } = await load('tests/surrogate-control.mjs')
const { default: shippedIndex } = await load('results/index.mjs')
const allSuites = [...indexSuites, surrogate]

const shippedPeers = ['squid.json', 'apache.json', 'trafficserver.json', 'varnish.json', 'nginx.json']
const readJson = path => JSON.parse(readFileSync(path, 'utf8'))

const isRequired = test => (test.kind === 'required' || test.kind === undefined) && !test.browser_only
const requiredOf = suites => suites.flatMap(suite =>
  suite.tests.filter(isRequired).map(test => ({ ...test, suite })))
const requiredIndex = requiredOf(indexSuites)
const requiredSurrogate = requiredOf([surrogate])

const verdictNames = new Map([
  ['✅', 'passed'], ['⛔️', 'failed'], ['🔹', 'set-up failure'], ['↻', 'retry'],
  ['⁉️', 'harness failure'], ['⚪️', 'dependency not passed'], ['-', 'not run']
])

function verdictOf (testId, results) {
  const symbol = display.determineTestResult(allSuites, testId, results)[2]
  const result = results[testId]
  if (symbol === '⛔️' && Array.isArray(result) && result[0] !== 'Assertion') {
    return 'errored'
  }
  return verdictNames.get(symbol)
}

function count (tests, results) {
  const counts = {
    passed: 0, ownPassed: 0, failed: 0, errored: 0, dependency: 0, notRun: 0, total: tests.length
  }
  for (const test of tests) {
    if (results[test.id] === true) counts.ownPassed++
    const verdict = verdictOf(test.id, results)
    if (verdict === 'passed') counts.passed++
    else if (verdict === 'failed') counts.failed++
    else if (verdict === 'dependency not passed') counts.dependency++
    else if (verdict === 'not run') counts.notRun++
    else counts.errored++
  }
  return counts
}

if (namedResults[0] === '--passed') {
  const results = readJson(namedResults[1])
  for (const test of requiredIndex) {
    if (results[test.id] === true) console.log(test.id)
  }
  process.exit(0)
}

const escapeCell = text => String(text).replace(/\|/g, '\\|').replace(/\n/g, ' ')
const stripMarkdownLinks = text => text.replace(/\[([^\]]*)\]\([^)]*\)/g, '$1')

const caches = namedResults.map(arg => {
  const split = arg.indexOf('=')
  if (split < 1) {
    console.error(`expected LABEL=RESULTS.json, got ${arg}`)
    process.exit(2)
  }
  const resultsFile = arg.slice(split + 1)
  const originRequestsFile = resultsFile.replace(/\.json$/, '') + '.origin-requests.json'
  return {
    label: arg.slice(0, split),
    results: readJson(resultsFile),
    originRequests: existsSync(originRequestsFile) ? readJson(originRequestsFile) : {},
    own: true
  }
})
for (const file of shippedPeers) {
  const entry = shippedIndex.find(item => item.file === file)
  caches.push({
    label: `${entry.name} ${entry.version} (shipped)`,
    results: readJson(join(packageDir, 'results', file)),
    own: false
  })
}

console.log(`## Required tests: ${requiredIndex.length} in tests/index.mjs, ` +
  `${requiredSurrogate.length} more in surrogate-control\n`)
console.log('| cache | passed | passed, own result | failed | errored | dependency not passed | not run | surrogate-control passed |')
console.log('|---|---|---|---|---|---|---|---|')
for (const cache of caches) {
  const c = count(requiredIndex, cache.results)
  const s = count(requiredSurrogate, cache.results)
  console.log(`| ${cache.label} | ${c.passed} | ${c.ownPassed} | ${c.failed} | ${c.errored} | ` +
    `${c.dependency} | ${c.notRun} | ${s.passed} of ${s.total} |`)
}

for (const cache of caches.filter(c => c.own)) {
  const notPassed = [...requiredIndex, ...requiredSurrogate]
    .filter(test => verdictOf(test.id, cache.results) !== 'passed')
  console.log(`\n## ${cache.label}: ${notPassed.length} required tests not passed\n`)
  let suiteId
  for (const test of notPassed) {
    if (test.suite.id !== suiteId) {
      suiteId = test.suite.id
      console.log(`\n### ${test.suite.name} (\`${suiteId}\`)\n`)
      console.log('| test | name | verdict | what the suite saw | the origin received | peers passing |')
      console.log('|---|---|---|---|---|---|')
    }
    const result = cache.results[test.id]
    const detail = result === undefined ? '' : result === true ? 'own result passed' : result[1]
    const peers = caches.filter(c => !c.own && verdictOf(test.id, c.results) === 'passed').length
    let verdict = verdictOf(test.id, cache.results)
    if (verdict === 'dependency not passed') {
      const blocking = test.depends_on.filter(id => verdictOf(id, cache.results) !== 'passed')
      verdict += ': ' + blocking.map(id => `\`${id}\``).join(', ')
    }
    const received = (cache.originRequests[test.id] || []).join('; ')
    console.log(`| \`${test.id}\` | ${escapeCell(stripMarkdownLinks(test.name))} | ` +
      `${verdict} | ${escapeCell(detail)} | ${escapeCell(received)} | ` +
      `${peers} of ${shippedPeers.length} |`)
  }
}
