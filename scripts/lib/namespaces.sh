# Sourced by the scripts that build namespaces (demo.sh, bench-e2e.sh).

# Stops the processes inside, then deletes, every network namespace whose name
# matches the extended regular expression $1: TERM first, KILL after half a second,
# so the daemons inside detach their XDP programs and close their taps cleanly.
remove_namespaces() {
    local pattern=$1 ns pid
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "$pattern" || true); do
        for pid in $(ip netns pids "$ns" 2>/dev/null); do
            kill -TERM "$pid" 2>/dev/null || true
        done
    done
    sleep 0.5
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "$pattern" || true); do
        for pid in $(ip netns pids "$ns" 2>/dev/null); do
            kill -KILL "$pid" 2>/dev/null || true
        done
        ip netns del "$ns" 2>/dev/null || true
    done
}
