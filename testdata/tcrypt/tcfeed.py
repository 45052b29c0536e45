#!/usr/bin/env python3
"""Answers a program's prompts on a pseudo-terminal (tcplay reads passphrases from the
terminal only): usage: tcfeed.py ANSWER... -- COMMAND ARGS..."""
import os, pty, sys, time, select
i = sys.argv.index('--')
lines, cmd = sys.argv[1:i], sys.argv[i+1:]
pid, fd = pty.fork()
if pid == 0:
    os.execvp(cmd[0], cmd)
out = b''
for l in lines:
    # wait for a prompt ending in ': ' or '? '
    while not (out.rstrip(b' ').endswith(b':') or out.rstrip().endswith(b'?') or out.rstrip().endswith(b')')):
        r, _, _ = select.select([fd], [], [], 30)
        if not r: break
        try: d = os.read(fd, 4096)
        except OSError: d = b''
        if not d: break
        out += d
    os.write(fd, l.encode() + b'\n')
    out = b''
    time.sleep(0.2)
while True:
    try: d = os.read(fd, 4096)
    except OSError: break
    if not d: break
    sys.stdout.buffer.write(d)
_, st = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(st))
