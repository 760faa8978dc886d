"""The seccomp filter every sandbox runs under: a classic-BPF program, built here with `struct`.

bubblewrap loads it (`bwrap --seccomp FD`) just before it starts the agent, so the agent and
everything the sandbox runs are filtered, and nothing inside can lift it (seccomp filters are
inherited and can only be added to). What it denies is what lets code inside reach another
process or the kernel beyond running itself:

* ptrace, process_vm_readv/writev, process_madvise, pidfd_getfd, kcmp: reading or writing
  another process (the agent, a harness) to forge what it reports;
* unshare, setns, clone with any CLONE_NEW* flag, and clone3 (its flags sit in memory a filter
  cannot read: ENOSYS, so libc falls back to clone): new namespaces, nested user namespaces
  included, which would hand the code capabilities of its own;
* mount and the new mount API, pivot_root, swapon/off, reboot, kexec, modules, keyctl and keys,
  bpf, perf_event_open, userfaultfd, io_uring (whose requests bypass seccomp), quotactl, acct,
  syslog, open_by_handle_at, clock and time setting, personality, vhangup, ioperm/iopl.

Denied calls fail with EPERM (ENOSYS for clone3); a syscall of another ABI (i386 or x32 on
x86_64) kills the process, so a filter written for one table cannot be sidestepped by another.
"""

from __future__ import annotations

import functools
import os
import platform
import struct

# Classic BPF opcodes (linux/filter.h, linux/seccomp.h).
LD_W_ABS, JEQ_K, JGE_K, JSET_K, RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
RET_KILL_PROCESS, RET_ERRNO, RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
EPERM, ENOSYS = 1, 38
# Offsets in struct seccomp_data: int nr, u32 arch, u64 ip, u64 args[6] (the low half of args[0]
# on little-endian machines, which both tables below are).
NR, ARCH, ARG0_LOW = 0, 4, 16
X32_SYSCALL_BIT = 0x40000000
# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME
CLONE_NEW_ANY = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x80

DENIED = (
    "ptrace", "process_vm_readv", "process_vm_writev", "process_madvise", "pidfd_getfd", "kcmp",
    "unshare", "setns", "mount", "umount2", "pivot_root", "open_tree", "move_mount", "fsopen",
    "fsconfig", "fsmount", "fspick", "mount_setattr", "swapon", "swapoff", "reboot", "kexec_load",
    "kexec_file_load", "init_module", "finit_module", "delete_module", "keyctl", "add_key",
    "request_key", "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "quotactl", "acct", "syslog", "open_by_handle_at", "name_to_handle_at",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "personality", "vhangup",
    "sethostname", "setdomainname", "fanotify_init", "lookup_dcookie", "iopl", "ioperm",
)

# Syscall numbers: arch/x86/entry/syscalls/syscall_64.tbl and include/uapi/asm-generic/unistd.h.
TABLES: dict[str, tuple[int, dict[str, int]]] = {
    "x86_64": (0xC000003E, {
        "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "process_madvise": 440,
        "pidfd_getfd": 438, "kcmp": 312, "unshare": 272, "setns": 308, "mount": 165, "umount2": 166,
        "pivot_root": 155, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
        "fsmount": 432, "fspick": 433, "mount_setattr": 442, "swapon": 167, "swapoff": 168,
        "reboot": 169, "kexec_load": 246, "kexec_file_load": 320, "init_module": 175,
        "finit_module": 313, "delete_module": 176, "keyctl": 250, "add_key": 248, "request_key": 249,
        "bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "io_uring_setup": 425,
        "io_uring_enter": 426, "io_uring_register": 427, "quotactl": 179, "acct": 163, "syslog": 103,
        "open_by_handle_at": 304, "name_to_handle_at": 303, "settimeofday": 164,
        "clock_settime": 227, "clock_adjtime": 305, "adjtimex": 159, "personality": 135,
        "vhangup": 153, "sethostname": 170, "setdomainname": 171, "fanotify_init": 300,
        "lookup_dcookie": 212, "iopl": 172, "ioperm": 173, "clone": 56, "clone3": 435,
    }),
    "aarch64": (0xC00000B7, {
        "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "process_madvise": 440,
        "pidfd_getfd": 438, "kcmp": 272, "unshare": 97, "setns": 268, "mount": 40, "umount2": 39,
        "pivot_root": 41, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
        "fsmount": 432, "fspick": 433, "mount_setattr": 442, "swapon": 224, "swapoff": 225,
        "reboot": 142, "kexec_load": 104, "kexec_file_load": 294, "init_module": 105,
        "finit_module": 273, "delete_module": 106, "keyctl": 219, "add_key": 217, "request_key": 218,
        "bpf": 280, "perf_event_open": 241, "userfaultfd": 282, "io_uring_setup": 425,
        "io_uring_enter": 426, "io_uring_register": 427, "quotactl": 60, "acct": 89, "syslog": 116,
        "open_by_handle_at": 265, "name_to_handle_at": 264, "settimeofday": 170,
        "clock_settime": 112, "clock_adjtime": 266, "adjtimex": 171, "personality": 92,
        "vhangup": 58, "sethostname": 161, "setdomainname": 162, "fanotify_init": 262,
        "lookup_dcookie": 18, "clone": 220, "clone3": 435,
    }),
}


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


@functools.lru_cache(maxsize=4)
def program(machine: str | None = None) -> bytes | None:
    """The filter for `machine` (default: this one) as bwrap's --seccomp reads it (an array of
    struct sock_filter), or None for a machine without a syscall table here."""
    machine = machine or platform.machine()
    if machine not in TABLES:
        return None
    arch, nr = TABLES[machine]
    ops = [_op(LD_W_ABS, ARCH), _op(JEQ_K, arch, 1, 0), _op(RET_K, RET_KILL_PROCESS), _op(LD_W_ABS, NR)]
    if machine == "x86_64":  # the x32 ABI: same table plus a bit, which would dodge every check
        ops += [_op(JGE_K, X32_SYSCALL_BIT, 0, 1), _op(RET_K, RET_KILL_PROCESS)]
    for name in DENIED:
        if name in nr:  # each check: equal -> the next op (deny), else skip it
            ops += [_op(JEQ_K, nr[name], 0, 1), _op(RET_K, RET_ERRNO | EPERM)]
    ops += [_op(JEQ_K, nr["clone3"], 0, 1), _op(RET_K, RET_ERRNO | ENOSYS)]
    # clone: allowed unless its flags (args[0]) ask for a new namespace.
    ops += [_op(JEQ_K, nr["clone"], 0, 3), _op(LD_W_ABS, ARG0_LOW), _op(JSET_K, CLONE_NEW_ANY, 0, 1),
            _op(RET_K, RET_ERRNO | EPERM)]
    ops.append(_op(RET_K, RET_ALLOW))
    return b"".join(ops)


def program_fd(prog: bytes) -> int:
    """A readable fd holding `prog` (for `bwrap --seccomp FD`, which reads it to the end)."""
    r, w = os.pipe()
    try:
        os.write(w, prog)  # a few hundred bytes: well under a pipe's buffer
    finally:
        os.close(w)
    return r
