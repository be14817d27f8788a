#!/usr/bin/env python3
"""SMTP load like benches/relay_load.rs: new connection per message, 1 KB body."""
import asyncio, sys, time
host, port = sys.argv[1], int(sys.argv[2])
n, conc, run = int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
size = 1024
def message(i):
    m = (f"From: Bench <bench@example.com>\r\nTo: rcpt@example.com\r\n"
         f"X-Bird-Idempotency-Key: {run}-{i}\r\nSubject: bench {i}\r\n\r\n").encode()
    line = b"The quick brown fox jumps over the lazy dog, again and again and again.\r\n"
    while len(m) + len(line) <= size: m += line
    while len(m) + 2 < size: m += b"x"
    return m + b"\r\n"
async def expect(r, code):
    while True:
        l = await r.readline()
        if not l: raise Exception("closed")
        if l[3:4] != b"-": break
    if not l.startswith(str(code).encode()): raise Exception(f"expected {code} got {l!r}")
nxt = 0
async def worker():
    global nxt
    while True:
        i = nxt; nxt += 1
        if i >= n: return
        r, w = await asyncio.open_connection(host, port)
        await expect(r, 220)
        w.write(b"EHLO load.test\r\n"); await expect(r, 250)
        w.write(b"MAIL FROM:<bench@example.com>\r\n"); await expect(r, 250)
        w.write(b"RCPT TO:<rcpt@example.com>\r\n"); await expect(r, 250)
        w.write(b"DATA\r\n"); await expect(r, 354)
        w.write(message(i)); w.write(b".\r\n"); await expect(r, 250)
        w.write(b"QUIT\r\n"); await r.read(); w.close()
async def main():
    t = time.time()
    await asyncio.gather(*[worker() for _ in range(conc)])
    print(f"{n} msgs C={conc} in {time.time()-t:.2f}s", file=sys.stderr)
asyncio.run(main())
