# Sourced by the scripts that run metronome under valgrind (callgrind, DHAT, cachegrind): installs
# Debian's valgrind when it is missing, so each of them runs on a fresh machine.
command -v valgrind >/dev/null 2>&1 || {
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null
}
