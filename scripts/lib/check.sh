# check.sh, sourced by the scripts that check a client end to end
# (inspector.sh, tsclient-*.sh) after they set CHECK_NAME, the prefix of
# what they print.
#
# check NAME WANT OUTPUT: a check passed when OUTPUT matches WANT, an
# extended regexp (a basic one when CHECK_GREP=-q); what failed is shown
# with OUTPUT's last lines. checked: prints "CHECK_NAME: N passed, M
# failed", and fails when one failed.
passed=0 failed=0
check() {
	if grep "${CHECK_GREP:--Eq}" -- "$2" <<<"$3"; then
		passed=$((passed + 1))
		echo "$CHECK_NAME: ok   $1" >&2
	else
		failed=$((failed + 1))
		echo "$CHECK_NAME: FAIL $1: output does not match $2:" >&2
		echo "$3" | tail -8 >&2
	fi
}
checked() {
	echo "$CHECK_NAME: $passed passed, $failed failed"
	[ "$failed" -eq 0 ]
}

# logged_url LOG: the URL a `wasmtools serve --http` logs (url=) into
# LOG, waited for up to a minute; none (and the log shown) fails.
logged_url() {
	local url=
	for _ in $(seq 1 600); do
		url=$(sed -n 's/.*url=\(http:[^ ]*\).*/\1/p' "$1" | head -1)
		[ -n "$url" ] && break
		sleep 0.1
	done
	[ -n "$url" ] || { echo "$CHECK_NAME: the HTTP server did not start:" >&2; cat "$1" >&2; return 1; }
	echo "$url"
}
