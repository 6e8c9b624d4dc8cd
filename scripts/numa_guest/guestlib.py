"""The kernel's list format ("0-3,8,10-11"), read: the guest checks' one helper."""


def expand(s):
    cpus = set()
    for part in filter(None, s.strip().split(",")):
        a, _, b = part.partition("-")
        cpus |= set(range(int(a), int(b or a) + 1))
    return cpus
