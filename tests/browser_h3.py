"""Downloads over HTTP/3 in Debian's chromium for tests/h3.rs, and prints what it saw.

The one argument is JSON: the page's URL (served by rangeway over TLS), the object's path on the
same origin, the origin to force QUIC on (host:port), the base64 SHA-256 of the test
certificate's public key (which chromium is told to accept: QUIC takes no certificate error),
a new empty profile folder, and chromium's path. The page is opened and the object fetched whole
and as a range by the page's own script. Prints one JSON object: the protocol of every request
(Resource Timing's nextHopProtocol), the statuses, the fetched bytes' SHA-256 and length, the
range's bytes. tests/h3.rs makes the assertions.
"""

import json
import sys

from playwright.sync_api import sync_playwright

FETCH = """async (path) => {
    const hex = (bytes) => [...new Uint8Array(bytes)]
        .map((b) => b.toString(16).padStart(2, "0")).join("");
    const whole = await fetch(path, { cache: "no-store" });
    const body = await whole.arrayBuffer();
    const ranged = await fetch(path, { cache: "no-store", headers: { Range: "bytes=100-199" } });
    const part = await ranged.arrayBuffer();
    return {
        status: whole.status,
        length: body.byteLength,
        sha256: hex(await crypto.subtle.digest("SHA-256", body)),
        range_status: ranged.status,
        range_hex: hex(part),
        navigation: performance.getEntriesByType("navigation")[0].nextHopProtocol,
        resources: performance.getEntriesByType("resource").map((e) => e.nextHopProtocol),
    };
}"""


def main():
    args = json.loads(sys.argv[1])
    flags = [
        # Chromium refuses to sandbox as root; this machine has no GPU, and nothing of the
        # browser's own traffic (updates, sync) belongs in the test.
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--enable-quic",
        f"--origin-to-force-quic-on={args['quic_origin']}",
        f"--ignore-certificate-errors-spki-list={args['spki']}",
    ]
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            args["profile"], executable_path=args["chromium"], args=flags, headless=True
        )
        page = context.new_page()
        page.goto(args["page"])
        seen = page.evaluate(FETCH, args["object"])
        context.close()
    print(json.dumps(seen))


main()
