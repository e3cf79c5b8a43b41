#!/usr/bin/env python3
"""An HTTP/3 client on aioquic (a QUIC and HTTP/3 stack nobody here wrote), for tests/h3.rs.

Sends the requests given, one after the other, on one QUIC connection, writes each body to its
file, and prints one JSON line per answer (status, header fields, body length, whether the
stream was reset), then one line about the connection (whether it migrated, the local addresses
it used).

    h3_client.py --connect 127.0.0.1:PORT --ca ca.pem \
        --request '{"path": "/obj.bin", "headers": {"range": "bytes=0-99"}, "out": "part"}' ...

With --rebind-after N, once N body bytes have arrived the client moves to a new UDP socket (a
new local port, and the address --rebind-host when given) on the same connection, as a phone
changing networks or a NAT rebinding would: the server sees its packets come from elsewhere.

With --zero-rtt, a first connection gets a session ticket, and the requests go on a second one
that resumes the session, sent in 0-RTT data where the server's ticket allows it.
"""

import argparse
import asyncio
import json
import socket
import sys

from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import ConnectionTerminated, StreamReset


class Answer:
    def __init__(self, out):
        self.status = None
        self.headers = {}
        self.file = open(out, "wb") if out else None
        self.length = 0
        self.reset = False
        self.done = asyncio.get_running_loop().create_future()

    def end(self):
        if self.file:
            self.file.close()
        if not self.done.done():
            self.done.set_result(None)


class Client(QuicConnectionProtocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.h3 = H3Connection(self._quic)
        self.answers = {}
        self.received = 0
        self.on_bytes = None

    def quic_event_received(self, event):
        if isinstance(event, StreamReset) and event.stream_id in self.answers:
            answer = self.answers[event.stream_id]
            answer.reset = True
            answer.end()
        if isinstance(event, ConnectionTerminated):
            for answer in self.answers.values():
                answer.reset = True
                answer.end()
        for h3_event in self.h3.handle_event(event):
            answer = self.answers.get(getattr(h3_event, "stream_id", None))
            if answer is None:
                continue
            if isinstance(h3_event, HeadersReceived):
                fields = {}
                for name, value in h3_event.headers:
                    name, value = name.decode(), value.decode()
                    if name == ":status":
                        answer.status = int(value)
                    else:
                        fields[name] = value
                answer.headers.update(fields)
            elif isinstance(h3_event, DataReceived):
                if answer.file:
                    answer.file.write(h3_event.data)
                answer.length += len(h3_event.data)
                self.received += len(h3_event.data)
                if self.on_bytes:
                    self.on_bytes(self.received)
            if getattr(h3_event, "stream_ended", False):
                answer.end()

    async def request(self, authority, path, fields, out, method="GET", body=None, cancel=None):
        stream_id = self._quic.get_next_available_stream_id()
        answer = Answer(out)
        self.answers[stream_id] = answer
        headers = [
            (b":method", method.encode()),
            (b":scheme", b"https"),
            (b":authority", authority.encode()),
            (b":path", path.encode()),
            (b"user-agent", b"aioquic-test"),
        ]
        headers += [(k.lower().encode(), v.encode()) for k, v in fields.items()]
        self.h3.send_headers(stream_id, headers, end_stream=body is None)
        if body is not None:
            self.h3.send_data(stream_id, body, end_stream=True)
        self.transmit()
        if cancel is None:
            await answer.done
            return answer
        # Gives up on the answer after `cancel` seconds, as a browser's aborted fetch does: the
        # stream is stopped (STOP_SENDING, H3_REQUEST_CANCELLED), the connection kept.
        try:
            await asyncio.wait_for(asyncio.shield(answer.done), cancel)
        except asyncio.TimeoutError:
            self._quic.stop_stream(stream_id, 0x10C)
            self.transmit()
            answer.reset = True
            answer.end()
        return answer


def local_address(protocol):
    name = protocol._transport.get_extra_info("sockname")
    return f"{name[0]}:{name[1]}"


async def rebind(protocol, host):
    """The connection moved to a new socket: a new port, on `host` when given."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    sock.bind(("::ffff:" + host if host else "::", 0, 0, 0))
    protocol.change_connection_id()
    protocol._transport.close()
    await loop.create_datagram_endpoint(lambda: protocol, sock=sock)
    protocol.transmit()


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--connect", required=True, help="HOST:PORT to send packets to")
    parser.add_argument("--server-name", default="localhost")
    parser.add_argument("--authority", help="the :authority (default: server name and port)")
    parser.add_argument("--ca", help="the CA file to trust")
    parser.add_argument(
        "--request", action="append", default=[],
        help="JSON: path, headers, out (the body's file), method, body_file (to upload), "
        "cancel_after (seconds, then the stream is stopped), hold (seconds to wait after)",
    )
    parser.add_argument("--rebind-after", type=int, help="body bytes after which to migrate")
    parser.add_argument("--rebind-host", help="the IPv4 address of the new socket")
    parser.add_argument("--zero-rtt", action="store_true", help="resume a session, in 0-RTT")
    args = parser.parse_args()

    host, port = args.connect.rsplit(":", 1)
    configuration = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN)
    configuration.server_name = args.server_name
    configuration.max_data = 16 << 20
    configuration.max_stream_data = 16 << 20
    configuration.idle_timeout = 30.0
    if args.ca:
        configuration.load_verify_locations(args.ca)
    authority = args.authority or f"{args.server_name}:{port}"

    early = {}
    if args.zero_rtt:
        tickets = []
        async with connect(
            host, int(port), configuration=configuration, create_protocol=Client,
            session_ticket_handler=tickets.append,
        ) as first:
            # The ticket comes after the handshake; one request's round trip is enough.
            await first.request(authority, "/", {}, None)
            for _ in range(50):
                if tickets:
                    break
                await asyncio.sleep(0.02)
        configuration.session_ticket = tickets[-1]
        early = {"wait_connected": False}

    async with connect(
        host, int(port), configuration=configuration, create_protocol=Client, **early
    ) as client:
        addresses = [local_address(client)]
        moved = asyncio.get_running_loop().create_future()
        if args.rebind_after is not None:
            def on_bytes(received):
                if received >= args.rebind_after and not moved.done():
                    moved.set_result(None)
                    client.on_bytes = None
            client.on_bytes = on_bytes

            async def migrate():
                await moved
                await rebind(client, args.rebind_host)
                addresses.append(local_address(client))

            migration = asyncio.ensure_future(migrate())
        for spec in args.request:
            spec = json.loads(spec)
            body = None
            if "body_file" in spec:
                with open(spec["body_file"], "rb") as uploaded:
                    body = uploaded.read()
            answer = await client.request(
                authority, spec["path"], spec.get("headers", {}), spec.get("out"),
                spec.get("method", "GET"), body, spec.get("cancel_after"),
            )
            # The connection stays a while after the request, open and idle.
            await asyncio.sleep(spec.get("hold", 0))
            line = {
                "status": answer.status,
                "headers": answer.headers,
                "length": answer.length,
                "reset": answer.reset,
            }
            print(json.dumps(line), flush=True)
        if args.rebind_after is not None:
            await asyncio.wait_for(migration, 5)
        tls = client._quic.tls
        connection = {
            "addresses": addresses,
            "resumed": tls.session_resumed,
            "early_data_accepted": tls.early_data_accepted,
        }
        print(json.dumps({"connection": connection}), flush=True)
        client.close()
        await client.wait_closed()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except Exception as e:  # the test reads what went wrong
        print(f"h3_client: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
