/*
 * floor_relay: the least an HTTP/1.1 relay can do, as a floor for the load harness
 * (benches/load/run.sh builds it with the system's cc and runs it as `splice-floor` and
 * `copy-floor`). It moves bytes and nothing else: no routing, no header rewriting, no logging.
 *
 *   floor_relay splice LISTEN_PORT ORIGIN_PORT [PIPE_KIB]    (default 1024: a 1 MiB pipe)
 *   floor_relay copy   LISTEN_PORT ORIGIN_PORT [BUFFER_KIB]  (default 1024)
 *
 * Both listen on 127.0.0.1:LISTEN_PORT and relay to 127.0.0.1:ORIGIN_PORT, one thread, one
 * epoll instance, edge-triggered. Each client connection is kept alive and gets its own kept-alive
 * origin connection (opened at its first request). A request's header (GET or HEAD; a request
 * with a body is answered 501) is forwarded as it came; the response's header is read until its
 * blank line and parsed for its Content-Length, then the header and exactly that many body bytes
 * are relayed, and the next request is read. Responses without a length (chunked, or delimited by
 * the origin's close) are answered 502: the harness's origin always sends a length.
 *
 * The body moves from the origin to the client:
 *   splice: origin -> pipe -> client with splice(2), through one pipe a connection sized with
 *           F_SETPIPE_SZ (the bytes never enter user space);
 *   copy:   read(2) into a buffer a connection, write(2) out of it.
 * On every readiness event both ends are drained until they would block: the pipe (or buffer)
 * is filled from the origin and emptied to the client again and again while either moves bytes,
 * up to a pipe-full (a buffer-full) sent a turn: a connection that could go on is queued behind the
 * others that are ready, so that one fast download does not hold the thread for its whole body
 * (rangeway's splice path yields after each pipe-full the same way).
 *
 * A descriptor counts as ready until a call on it says otherwise: EAGAIN, or for a buffer's
 * read and any write a count short of what was asked (the kernel took what it had room for, or
 * gave what it had, and a new edge comes when that changes: nginx reads epoll the same way).
 * A splice into the pipe that comes back short (or says EAGAIN while the pipe holds bytes) may
 * have been cut by the pipe rather than the socket: each of the pipe's slots holds one of the
 * socket's fragments, and the slots can run out before the bytes do. So the origin is tried again
 * as soon as some of the pipe has gone on to the client; without that, the last bytes of a
 * response left in the socket would wait for an edge that never comes.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#define HEADER_MAX (16 * 1024) /* request and response headers, each at most this */

enum mode { SPLICE, COPY };
enum state {
    READ_REQUEST,  /* reading the client's request header */
    SEND_REQUEST,  /* writing it to the origin */
    READ_RESPONSE, /* reading the origin's response header */
    RELAY,         /* writing the header, then moving the body */
};

struct conn {
    int client, origin;
    int pipe_r, pipe_w; /* splice: the connection's pipe */
    enum state state;
    /* What epoll last said of each end, until a call says it would block. */
    int client_in, client_out, origin_in, origin_out;
    int retry_in; /* splice: the pipe may have been full at the last EAGAIN from the origin */
    int close_after;  /* the client asked to close after this response */
    int origin_close; /* the origin said it closes after this response */
    int head;         /* the request was a HEAD: no body comes */
    /* The request: req[0, req_len), of which the first req_head bytes are its header. */
    char req[HEADER_MAX];
    size_t req_len, req_head, req_sent;
    /* User-space bytes on their way to the client: the response's header (and whatever of the
     * body came with it) in both modes, and the body itself in copy mode. */
    char *buf;
    size_t buf_cap, buf_off, buf_len;
    uint64_t to_read; /* body bytes still to take from the origin */
    size_t in_pipe;   /* splice: body bytes in the pipe */
    /* Queued to go on after its turn's pipe-full; closed while queued (freed when dequeued). */
    int queued, closed;
    struct conn *next_ready;
};

static enum mode mode;
static size_t chunk; /* pipe size (splice) or buffer size (copy) */
static int epfd;
static struct sockaddr_in origin_addr;
static struct conn **by_fd; /* descriptor -> its connection, for both ends */
static size_t by_fd_len;
static struct conn *ready_head, *ready_tail; /* connections to go on without waiting for epoll */

static void die(const char *what) {
    perror(what);
    exit(1);
}

static int set_nonblocking(int fd) {
    int flags = fcntl(fd, F_GETFL);
    return flags < 0 ? -1 : fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

static int watch(int fd, struct conn *c) {
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET, .data.fd = fd};
    if ((size_t)fd >= by_fd_len) {
        errno = EMFILE;
        return -1;
    }
    by_fd[fd] = c;
    return epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev);
}

static void forget(int fd) {
    if (fd < 0)
        return;
    if ((size_t)fd < by_fd_len)
        by_fd[fd] = NULL;
    close(fd); /* closing removes it from the epoll set */
}

static void conn_close(struct conn *c) {
    forget(c->client);
    forget(c->origin);
    c->client = c->origin = -1;
    if (c->pipe_r >= 0) {
        close(c->pipe_r);
        close(c->pipe_w);
        c->pipe_r = c->pipe_w = -1;
    }
    free(c->buf);
    c->buf = NULL;
    c->closed = 1;
    if (!c->queued) /* else the ready queue frees it */
        free(c);
}

static void enqueue(struct conn *c) {
    if (c->queued)
        return;
    c->queued = 1;
    c->next_ready = NULL;
    if (ready_tail)
        ready_tail->next_ready = c;
    else
        ready_head = c;
    ready_tail = c;
}

/* Case-insensitive search for a header line's name at the start of a line; returns the value. */
static const char *header_value(const char *head, size_t len, const char *name) {
    size_t n = strlen(name);
    const char *p = memchr(head, '\n', len);
    const char *end = head + len;
    while (p && p + 1 < end) {
        p++;
        if ((size_t)(end - p) > n && strncasecmp(p, name, n) == 0 && p[n] == ':') {
            const char *v = p + n + 1;
            while (v < end && (*v == ' ' || *v == '\t'))
                v++;
            return v;
        }
        p = memchr(p, '\n', (size_t)(end - p));
    }
    return NULL;
}

/* A header's value as a decimal number, digits only up to the line's end (the buffers hold no
 * terminating NUL, and strtoull would skip the line break as white space); -1 if it is none. */
static int parse_number(const char *v, const char *end, uint64_t *out) {
    uint64_t n = 0;
    const char *p = v;
    for (; p < end && *p >= '0' && *p <= '9'; p++) {
        if (n > (UINT64_MAX - 9) / 10)
            return -1;
        n = n * 10 + (uint64_t)(*p - '0');
    }
    while (p < end && (*p == ' ' || *p == '\t'))
        p++;
    if (p == v || p == end || *p != '\r')
        return -1;
    *out = n;
    return 0;
}

/* Whether the header's value (up to the line's end) contains the token, case-insensitively. */
static int value_has(const char *v, const char *end, const char *token) {
    size_t n = strlen(token);
    for (; v && v + n <= end && *v != '\r' && *v != '\n'; v++)
        if (strncasecmp(v, token, n) == 0)
            return 1;
    return 0;
}

static const char *find_blank_line(const char *p, size_t len) {
    const char *end = memmem(p, len, "\r\n\r\n", 4);
    return end ? end + 4 : NULL;
}

/* A short answer of the relay's own, then the connection closes. */
static void answer_and_close(struct conn *c, const char *status) {
    char msg[128];
    int n = snprintf(msg, sizeof msg, "HTTP/1.1 %s\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", status);
    if (n > 0 && write(c->client, msg, (size_t)n) < 0) {
        /* the client is gone or full: closing is all there is left to do */
    }
    conn_close(c);
}

/* Parses the request header in c->req; returns 0, or -1 after answering (not relayable). */
static int parse_request(struct conn *c) {
    const char *end = c->req + c->req_head;
    const char *v;
    c->head = c->req_head >= 5 && memcmp(c->req, "HEAD ", 5) == 0;
    uint64_t length = 0;
    v = header_value(c->req, c->req_head, "Content-Length");
    if (header_value(c->req, c->req_head, "Transfer-Encoding") ||
        (v && (parse_number(v, end, &length) < 0 || length > 0))) {
        answer_and_close(c, "501 Not Implemented");
        return -1;
    }
    const char *line_end = memchr(c->req, '\r', c->req_head);
    int http10 = line_end && line_end - c->req >= 8 && memcmp(line_end - 8, "HTTP/1.0", 8) == 0;
    v = header_value(c->req, c->req_head, "Connection");
    c->close_after = http10 ? !value_has(v, end, "keep-alive") : value_has(v, end, "close");
    return 0;
}

/* Parses the response header at c->buf[0, head); returns 0, or -1 after answering. */
static int parse_response(struct conn *c, size_t head) {
    const char *end = c->buf + head;
    /* "HTTP/1.x NNN": the status is the three digits after the first space. */
    if (head < 12 || memcmp(c->buf, "HTTP/1.", 7) != 0 || c->buf[8] != ' ' ||
        c->buf[9] < '0' || c->buf[9] > '9' || c->buf[10] < '0' || c->buf[10] > '9' ||
        c->buf[11] < '0' || c->buf[11] > '9') {
        answer_and_close(c, "502 Bad Gateway");
        return -1;
    }
    int status = (c->buf[9] - '0') * 100 + (c->buf[10] - '0') * 10 + (c->buf[11] - '0');
    const char *v = header_value(c->buf, head, "Connection");
    c->origin_close = value_has(v, end, "close") || memcmp(c->buf, "HTTP/1.0", 8) == 0;
    if (status >= 100 && status < 200) { /* an interim answer: not relayed here */
        answer_and_close(c, "502 Bad Gateway");
        return -1;
    }
    if (c->head || status == 204 || status == 304) {
        c->to_read = 0;
    } else if (header_value(c->buf, head, "Transfer-Encoding")) {
        answer_and_close(c, "502 Bad Gateway");
        return -1;
    } else if ((v = header_value(c->buf, head, "Content-Length"))) {
        if (parse_number(v, end, &c->to_read) < 0) {
            answer_and_close(c, "502 Bad Gateway");
            return -1;
        }
    } else {
        answer_and_close(c, "502 Bad Gateway");
        return -1;
    }
    /* Body bytes that came with the header count against the length. */
    size_t extra = c->buf_len - head;
    if (extra > c->to_read) { /* more than this response: the origin is broken */
        answer_and_close(c, "502 Bad Gateway");
        return -1;
    }
    c->to_read -= extra;
    return 0;
}

static int open_origin(struct conn *c) {
    int one = 1;
    c->origin = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c->origin < 0)
        return -1;
    /* Blocking connect: on loopback it completes at once. */
    while (connect(c->origin, (struct sockaddr *)&origin_addr, sizeof origin_addr) < 0)
        if (errno != EINTR)
            return -1;
    if (setsockopt(c->origin, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0 ||
        set_nonblocking(c->origin) < 0 || watch(c->origin, c) < 0)
        return -1;
    c->origin_in = c->origin_out = 1;
    return 0;
}

static int open_pipe(struct conn *c) {
    int p[2];
    if (pipe2(p, O_NONBLOCK | O_CLOEXEC) < 0)
        return -1;
    c->pipe_r = p[0];
    c->pipe_w = p[1];
    if (fcntl(c->pipe_w, F_SETPIPE_SZ, (int)chunk) < 0) {
        perror("F_SETPIPE_SZ"); /* the floor must be what it says it is */
        exit(1);
    }
    return 0;
}

/* Moves what can be moved, up to a pipe-full (buffer-full) to the client; returns 0, or -1 when
 * the connection has been closed. */
static int advance(struct conn *c) {
    ssize_t n;
    size_t sent = 0; /* body bytes given to the client in this turn */
    if (c->closed)
        return -1;
    for (;;) {
        switch (c->state) {
        case READ_REQUEST: {
            const char *end = find_blank_line(c->req, c->req_len);
            if (!end) {
                if (c->req_len == sizeof c->req) {
                    answer_and_close(c, "431 Request Header Fields Too Large");
                    return -1;
                }
                if (!c->client_in)
                    return 0;
                n = read(c->client, c->req + c->req_len, sizeof c->req - c->req_len);
                if (n < 0 && errno == EINTR)
                    continue;
                if (n < 0 && errno == EAGAIN) {
                    c->client_in = 0;
                    return 0;
                }
                if (n <= 0) { /* the client closed (or failed) between requests */
                    conn_close(c);
                    return -1;
                }
                if ((size_t)n < sizeof c->req - c->req_len)
                    c->client_in = 0;
                c->req_len += (size_t)n;
                continue;
            }
            c->req_head = (size_t)(end - c->req);
            c->req_sent = 0;
            if (parse_request(c) < 0)
                return -1;
            if (c->origin < 0 && open_origin(c) < 0) {
                answer_and_close(c, "502 Bad Gateway");
                return -1;
            }
            c->state = SEND_REQUEST;
            continue;
        }
        case SEND_REQUEST:
            if (c->req_sent < c->req_head) {
                if (!c->origin_out)
                    return 0;
                n = write(c->origin, c->req + c->req_sent, c->req_head - c->req_sent);
                if (n < 0 && errno == EINTR)
                    continue;
                if (n < 0 && errno == EAGAIN) {
                    c->origin_out = 0;
                    return 0;
                }
                if (n < 0) {
                    answer_and_close(c, "502 Bad Gateway");
                    return -1;
                }
                if ((size_t)n < c->req_head - c->req_sent)
                    c->origin_out = 0;
                c->req_sent += (size_t)n;
                continue;
            }
            /* Keep what the client sent after this request (a pipelined next one). */
            memmove(c->req, c->req + c->req_head, c->req_len - c->req_head);
            c->req_len -= c->req_head;
            c->buf_off = c->buf_len = 0;
            c->state = READ_RESPONSE;
            continue;
        case READ_RESPONSE: {
            const char *end = find_blank_line(c->buf, c->buf_len);
            if (!end) {
                if (c->buf_len >= HEADER_MAX) {
                    answer_and_close(c, "502 Bad Gateway");
                    return -1;
                }
                if (!c->origin_in)
                    return 0;
                /* Up to the whole buffer: in copy mode the body's first bytes may come along. */
                size_t room = (mode == COPY ? c->buf_cap : HEADER_MAX) - c->buf_len;
                n = read(c->origin, c->buf + c->buf_len, room);
                if (n < 0 && errno == EINTR)
                    continue;
                if (n < 0 && errno == EAGAIN) {
                    c->origin_in = 0;
                    return 0;
                }
                if (n <= 0) {
                    answer_and_close(c, "502 Bad Gateway");
                    return -1;
                }
                if ((size_t)n < room)
                    c->origin_in = 0;
                c->buf_len += (size_t)n;
                continue;
            }
            if (parse_response(c, (size_t)(end - c->buf)) < 0)
                return -1;
            if (mode == SPLICE && c->to_read > 0 && c->pipe_r < 0 && open_pipe(c) < 0)
                die("pipe2");
            c->in_pipe = 0;
            c->retry_in = 0;
            c->state = RELAY;
            continue;
        }
        case RELAY: {
            int moved = 0;
            /* User-space bytes first: the header, and in copy mode the body. The buffer is
             * filled at its end while its start is written, and starts over once empty. */
            if (c->buf_off == c->buf_len)
                c->buf_off = c->buf_len = 0;
            if (mode == COPY && c->to_read > 0 && c->buf_len < c->buf_cap && c->origin_in) {
                size_t room = c->buf_cap - c->buf_len;
                size_t want = room < c->to_read ? room : (size_t)c->to_read;
                n = read(c->origin, c->buf + c->buf_len, want);
                if (n < 0 && errno == EINTR)
                    continue;
                if (n < 0 && errno == EAGAIN) {
                    c->origin_in = 0;
                } else if (n <= 0) { /* the origin closed inside the body: nothing to finish */
                    conn_close(c);
                    return -1;
                } else {
                    if ((size_t)n < want)
                        c->origin_in = 0;
                    c->buf_len += (size_t)n;
                    c->to_read -= (uint64_t)n;
                    moved = 1;
                }
            }
            if (c->buf_off < c->buf_len && c->client_out) {
                size_t want = c->buf_len - c->buf_off;
                n = write(c->client, c->buf + c->buf_off, want);
                if (n < 0 && errno == EINTR)
                    continue;
                if (n < 0 && errno == EAGAIN) {
                    c->client_out = 0;
                } else if (n < 0) {
                    conn_close(c);
                    return -1;
                } else {
                    if ((size_t)n < want)
                        c->client_out = 0;
                    c->buf_off += (size_t)n;
                    sent += (size_t)n;
                    moved = 1;
                }
            }
            if (mode == SPLICE && c->buf_off == c->buf_len) {
                if (c->to_read > 0 && c->in_pipe < chunk && c->origin_in) {
                    size_t room = chunk - c->in_pipe;
                    size_t want = room < c->to_read ? room : (size_t)c->to_read;
                    n = splice(c->origin, NULL, c->pipe_w, NULL, want, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
                    if (n < 0 && errno == EINTR)
                        continue;
                    if (n < 0 && errno == EAGAIN) {
                        c->origin_in = 0;
                        c->retry_in = c->in_pipe > 0;
                    } else if (n <= 0) {
                        conn_close(c);
                        return -1;
                    } else {
                        if ((size_t)n < want) { /* the socket, or the pipe's slots, ran out */
                            c->origin_in = 0;
                            c->retry_in = 1;
                        }
                        c->in_pipe += (size_t)n;
                        c->to_read -= (uint64_t)n;
                        moved = 1;
                    }
                }
                if (c->in_pipe > 0 && c->client_out) {
                    n = splice(c->pipe_r, NULL, c->client, NULL, c->in_pipe, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
                    if (n < 0 && errno == EINTR)
                        continue;
                    if (n < 0 && errno == EAGAIN) {
                        c->client_out = 0;
                    } else if (n <= 0) {
                        conn_close(c);
                        return -1;
                    } else {
                        if ((size_t)n < c->in_pipe)
                            c->client_out = 0;
                        c->in_pipe -= (size_t)n;
                        sent += (size_t)n;
                        moved = 1;
                        if (c->retry_in) { /* room again: the origin's EAGAIN may have been the pipe's */
                            c->origin_in = 1;
                            c->retry_in = 0;
                        }
                    }
                }
            }
            if (c->to_read == 0 && c->buf_off == c->buf_len && c->in_pipe == 0) {
                /* The response is through. */
                if (c->close_after) {
                    conn_close(c);
                    return -1;
                }
                if (c->origin_close) {
                    forget(c->origin);
                    c->origin = -1;
                }
                c->state = READ_REQUEST;
                continue;
            }
            if (!moved)
                return 0;
            if (sent >= chunk) { /* its turn is over: the others that are ready go first */
                enqueue(c);
                return 0;
            }
            continue;
        }
        }
    }
}

static void accept_all(int listener) {
    for (;;) {
        int fd = accept4(listener, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno == EAGAIN)
                return;
            if (errno == EMFILE || errno == ENFILE) { /* wait for a descriptor to come free */
                fprintf(stderr, "floor_relay: out of descriptors\n");
                return;
            }
            die("accept4");
        }
        struct conn *c = calloc(1, sizeof *c);
        if (!c)
            die("calloc");
        c->client = fd;
        c->origin = c->pipe_r = c->pipe_w = -1;
        c->client_in = c->client_out = 1;
        c->state = READ_REQUEST;
        c->buf_cap = mode == COPY && chunk > HEADER_MAX ? chunk : HEADER_MAX;
        c->buf = malloc(c->buf_cap);
        int one = 1;
        if (!c->buf || setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0 || watch(fd, c) < 0) {
            fprintf(stderr, "floor_relay: cannot take a connection: %s\n", strerror(errno));
            forget(fd);
            free(c->buf);
            free(c);
            continue;
        }
        advance(c);
    }
}

static int port_of(const char *s) {
    char *end;
    long p = strtol(s, &end, 10);
    if (*end || p <= 0 || p > 65535) {
        fprintf(stderr, "floor_relay: not a port: %s\n", s);
        exit(2);
    }
    return (int)p;
}

int main(int argc, char **argv) {
    if (argc < 4 || argc > 5 || (strcmp(argv[1], "splice") != 0 && strcmp(argv[1], "copy") != 0)) {
        fprintf(stderr, "usage: %s splice|copy LISTEN_PORT ORIGIN_PORT [PIPE_OR_BUFFER_KIB]\n", argv[0]);
        return 2;
    }
    mode = strcmp(argv[1], "splice") == 0 ? SPLICE : COPY;
    long kib = argc == 5 ? strtol(argv[4], NULL, 10) : 1024;
    if (kib < 4 || kib > 1024 * 1024) {
        fprintf(stderr, "floor_relay: a size from 4 KiB to 1 GiB, not %s\n", argv[4]);
        return 2;
    }
    chunk = (size_t)kib * 1024;
    signal(SIGPIPE, SIG_IGN); /* a client gone: write says EPIPE */

    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
        die("getrlimit");
    by_fd_len = rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > (1 << 20) ? (1 << 20) : (size_t)rl.rlim_cur;
    by_fd = calloc(by_fd_len, sizeof *by_fd);
    if (!by_fd)
        die("calloc");

    memset(&origin_addr, 0, sizeof origin_addr);
    origin_addr.sin_family = AF_INET;
    origin_addr.sin_port = htons((uint16_t)port_of(argv[3]));
    origin_addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);

    struct sockaddr_in addr = origin_addr;
    addr.sin_port = htons((uint16_t)port_of(argv[2]));
    int listener = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (listener < 0 || setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0)
        die("socket");
    if (bind(listener, (struct sockaddr *)&addr, sizeof addr) < 0)
        die("bind");
    if (listen(listener, 4096) < 0)
        die("listen");
    epfd = epoll_create1(EPOLL_CLOEXEC);
    if (epfd < 0)
        die("epoll_create1");
    struct epoll_event lev = {.events = EPOLLIN | EPOLLET, .data.fd = listener};
    if (epoll_ctl(epfd, EPOLL_CTL_ADD, listener, &lev) < 0)
        die("epoll_ctl");

    struct epoll_event events[256];
    for (;;) {
        /* Connections queued after their turn go on as soon as the new events are taken in. */
        int n = epoll_wait(epfd, events, 256, ready_head ? 0 : -1);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            die("epoll_wait");
        }
        for (int i = 0; i < n; i++) {
            int fd = events[i].data.fd;
            if (fd == listener) {
                accept_all(listener);
                continue;
            }
            struct conn *c = by_fd[fd];
            if (!c) /* closed earlier in this batch */
                continue;
            uint32_t e = events[i].events;
            /* An error or hang-up makes every call return at once, with what happened. */
            int in = (e & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0;
            int out = (e & (EPOLLOUT | EPOLLHUP | EPOLLERR)) != 0;
            if (fd == c->client) {
                c->client_in |= in;
                c->client_out |= out;
            } else {
                c->origin_in |= in;
                c->origin_out |= out;
            }
            advance(c);
        }
        /* One more turn for each connection queued before this round (those it queues again
         * wait for the next). */
        struct conn *c = ready_head;
        ready_head = ready_tail = NULL;
        while (c) {
            struct conn *next = c->next_ready;
            c->queued = 0;
            if (c->closed)
                free(c);
            else
                advance(c);
            c = next;
        }
    }
}
