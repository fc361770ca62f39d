#!/bin/bash
# Experiment wrapper: a collector config with a "# gogc: N" comment runs with GOGC=N.
prev=""; for a in "$@"; do [ "$prev" = "--config" ] && cfg=$a; prev=$a; done
if [ -n "$cfg" ]; then g=$(grep -o '# gogc: [0-9a-z]*' "$cfg" | head -1 | awk '{print $3}'); [ -n "$g" ] && export GOGC=$g; fi
exec /work/main/_build/otelcol-throttle "$@"
