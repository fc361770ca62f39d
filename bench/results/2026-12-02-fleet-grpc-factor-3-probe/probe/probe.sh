#!/bin/bash
# Sampled beside a fleet run (the gateway's pprof port from its config): host CPU busy % from
# /proc/stat, the top processes, and the gateway's goroutines, every 2 s. Ad hoc, for the run here.
# probe OUT: every 2 s host CPU busy %, top processes, and the gateway's goroutine summary
OUT=$1; mkdir -p $OUT/probe
end=$((SECONDS+600))
prev=($(head -1 /proc/stat))
while [ $SECONDS -lt $end ]; do
  sleep 2
  cur=($(head -1 /proc/stat))
  idle=$(( (cur[4]+cur[5]) - (prev[4]+prev[5]) ))
  tot=0; for i in 1 2 3 4 5 6 7 8; do tot=$((tot + cur[i] - prev[i])); done
  prev=("${cur[@]}")
  ts=$(date +%s.%N)
  echo "$ts busy=$(( 100*(tot-idle)/ (tot>0?tot:1) ))" >> $OUT/probe/host.txt
  top -b -n1 -w 200 | sed -n 8,16p | awk -v t=$ts '{print t, $1, $9, $12, $13, $14}' >> $OUT/probe/top.txt
  cfg=$(ls $OUT/config-throttle-gateway.yaml 2>/dev/null)
  if [ -n "$cfg" ]; then
    port=$(grep -A1 "pprof" $cfg | grep -o '127.0.0.1:[0-9]*' | head -1)
    [ -n "$port" ] && curl -s -m 2 "http://$port/debug/pprof/goroutine?debug=1" > $OUT/probe/g-$ts.txt
  fi
  [ -f $OUT/report.md ] && break
done
