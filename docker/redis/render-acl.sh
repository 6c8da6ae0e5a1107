#!/bin/sh
# render-acl.sh TEMPLATE OUTPUT: users.acl.template -> a Redis ACL file (see the template's header).
set -eu
template=$1
output=$2
umask 077
trap 'rm -f "$output.tmp"' EXIT
awk '
  function fail(message) { print "render-acl: " message > "/dev/stderr"; failed = 1; exit 1 }
  function substitute(text,    name, value) {
    while (match(text, /\$\{[A-Za-z_][A-Za-z0-9_]*\}/)) {
      name = substr(text, RSTART + 2, RLENGTH - 3)
      value = ENVIRON[name]
      if (value == "") fail(name " is not set")
      if (value !~ /^[A-Za-z0-9._~-]+$/) fail(name " may hold only A-Z a-z 0-9 . _ ~ -")
      text = substr(text, 1, RSTART - 1) value substr(text, RSTART + RLENGTH)
    }
    return text
  }
  /^[ \t]*#/ || /^[ \t]*$/ { next }
  /^[ \t]/ { sub(/^[ \t]+/, " "); line = line $0; next }
  { if (line != "") print substitute(line); line = $0 }
  END { if (!failed && line != "") print substitute(line) }
' "$template" > "$output.tmp"
mv "$output.tmp" "$output"
