#!/usr/bin/env bash
# bench/tls.sh: HTTPS keep-alive requests/s, corral against nginx with TLS, in one run.
#
#   bench/tls.sh [--duration S] [--warmup S] [--connections N] [--cases a,b]
#                [--priority rt|nice|none]
#
# Cases: (a) GET /hello, 5-byte body, HTTPS keep-alive; (b) GET /64k.bin, a 64 KiB static file
# over HTTPS keep-alive (corral reads it into its buffer and encrypts, nginx too: no sendfile
# under TLS for either).
#
# Same method as bench/run.sh (read its header): the server under test on CPU 0 (corral: one
# server process under its supervisor, the supervisor idle; nginx: worker_processes 1), wrk on
# CPU 1 (-t1 -c50, OpenSSL, TLS 1.3), one server at a time, a warm-up run that is not measured.
# Both servers use the same certificate (an ECDSA P-256 one made by `corral cert`), TLS 1.2 and
# 1.3 with session tickets; wrk makes its connections once, so handshakes are not what is measured
# but the record layer (AES-GCM) and the HTTP path are. "proc CPU/req" is the server processes'
# own time on CPU (/proc/PID/schedstat, children included) per request.
#
# Environment: CORRAL_BIN (use this binary, do not build), NGINX_BIN (default: nginx in PATH).
# Needs: wrk, nginx (with the ssl module: nginx-light has it), curl, python3, taskset.
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
help_lines=2,20

duration=10
warmup=2
conns=50
cases="a,b"
priority=$(rt_if_root)
parse_flags "--duration duration --warmup warmup --connections conns --cases cases --priority priority" "$@"
set_prio "$priority"

find_nginx
need_tools wrk curl python3 taskset "$nginx_bin"
need_cpus "(server on CPU 0, wrk on CPU 1)"
find_corral

make_tmp corral-tls-bench
mkdir -p "$tmp/www" "$tmp/state"
head -c 65536 /dev/urandom >"$tmp/www/64k.bin"
printf 'hello' >"$tmp/www/hello"
chmod -R a+rX "$tmp/www"
"$corral" cert --dir "$tmp/cert" >/dev/null
chmod 644 "$tmp/cert/dev-key.pem"  # nginx reads it as root before dropping privileges anyway
cert="$tmp/cert/dev-cert.pem"
key="$tmp/cert/dev-key.pem"

start_server() {  # $1 nginx|corral  $2 port  $3 hello|static
  case "$1" in
    nginx)
      write_nginx_conf "$2 ssl" "worker_processes 1;" "  types { application/octet-stream bin; }
  default_type application/octet-stream;
  ssl_certificate $cert;
  ssl_certificate_key $key;
  ssl_protocols TLSv1.2 TLSv1.3;
  ssl_session_tickets on;" "    root $tmp/www;
    location / { }"
      "${prio[@]}" taskset -c 0 "$nginx_bin" -p "$tmp" -c "$tmp/nginx.conf" -e "$tmp/nginx-error.log" \
        >"$tmp/server.out" 2>&1 &
      ;;
    corral)
      # The plain listener is unused; the TLS one is measured. As in run.sh: /hello is the
      # embedded site's 5-byte route (nginx: `return 200`), /64k.bin comes from a served DIR.
      local dir=()
      [[ "$3" == static ]] && dir=("$tmp/www")
      "${prio[@]}" taskset -c 0 "$corral" serve "${dir[@]}" --listen "127.0.0.1:0" \
        --tls-listen "127.0.0.1:$2" --cert "$cert" --key "$key" --state-dir "$tmp/state" \
        --no-access-log --log-level warn >"$tmp/server.out" 2>&1 &
      ;;
  esac
  server_pid=$!
  if [[ "$3" == static ]]; then
    await_body "$1" "https://localhost:$2/64k.bin" 65536 --cacert "$cert"
  else
    await_body "$1" "https://localhost:$2/hello" 5 --cacert "$cert"
  fi
}

results="$tmp/results.txt"
: >"$results"
measure() {  # $1 case  $2 server  $3 port
  local path=/hello
  [[ "$1" == b ]] && path=/64k.bin
  local url="https://localhost:$3$path"
  local wrk_cmd=("${prio[@]}" taskset -c 1 wrk -t1 "-c$conns" --latency)
  "${wrk_cmd[@]}" "-d${warmup}s" "$url" >/dev/null 2>&1 || true
  local p0 p1 out reqs rps p99 errors non2xx
  p0=$(proc_cpu_ns "$server_pid")
  out=$("${wrk_cmd[@]}" "-d${duration}s" "$url" 2>&1)
  p1=$(proc_cpu_ns "$server_pid")
  wrk_fields "$out"
  p99=$(awk '$1 == "99%" { print $2 }' <<<"$out")  # as wrk prints it: "1.23ms"
  errors=$((${errors:-0} + ${non2xx:-0}))
  wrk_ran "$out" "for case $1 on $2" || return 1
  local proc_us
  proc_us=$(awk -v d=$((p1 - p0)) -v n="$reqs" 'BEGIN { printf "%.2f", d / 1e3 / n }')
  echo "$1 $2 $rps $p99 $proc_us ${errors:-0}" >>"$results"
  printf 'tls.sh: case %s %-6s %10s req/s  p99 %8s  proc/req %6s us  errors %s\n' \
    "$1" "$2" "$rps" "$p99" "$proc_us" "${errors:-0}" >&2
}

IFS=, read -ra case_list <<<"$cases"
for c in "${case_list[@]}"; do
  for server in nginx corral; do
    port=$(free_port)
    kind=hello
    [[ "$c" == b ]] && kind=static
    start_server "$server" "$port" "$kind"
    measure "$c" "$server" "$port"
    stop_server
  done
done

awk -v dur="$duration" -v conns="$conns" -v prio="$priority" -v date="$(utc_minute)" \
    -v cpumodel="$(cpu_model)" -v nginxv="$(nginx_version)" '
  function name(c) {
    if (c == "a") return "(a) 5-byte, HTTPS keep-alive";
    if (c == "b") return "(b) 64 KiB file, HTTPS keep-alive";
    return c;
  }
  function ratio(x, y) { return (x > 0 && y > 0) ? sprintf("%.2f", x / y) : "-" }
  { if (!($1 in seen)) { seen[$1] = 1; cases[++n] = $1 }
    rps[$1, $2] = $3; p99[$1, $2] = $4; proc[$1, $2] = $5; err[$1, $2] = $6 }
  END {
    printf "<!-- bench/tls.sh --duration %s --priority %s, %s, %s, nginx %s, wrk -t1 -c%s -->\n",
      dur, prio, date, cpumodel, nginxv, conns
    print "| case | nginx req/s | corral req/s | corral/nginx | nginx p99 | corral p99 | nginx proc CPU/req | corral proc CPU/req | errors (nginx/corral) |"
    print "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    for (i = 1; i <= n; i++) {
      c = cases[i]
      printf "| %s | %.0f | %.0f | %s | %s | %s | %.2f us | %.2f us | %d/%d |\n", name(c),
        rps[c, "nginx"], rps[c, "corral"], ratio(rps[c, "corral"], rps[c, "nginx"]),
        p99[c, "nginx"], p99[c, "corral"], proc[c, "nginx"], proc[c, "corral"],
        err[c, "nginx"], err[c, "corral"]
    }
  }' "$results"
