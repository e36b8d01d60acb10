# ExecStopPost of containerd and the kubelet: when one ends other than by a
# clean stop, its last lines go to the console the host reads.
[ "${SERVICE_RESULT:-success}" = success ] && exit 0
exec >/dev/console 2>&1
echo "amf-vmnode: failed unit=$1 result=$SERVICE_RESULT code=${EXIT_CODE:-} status=${EXIT_STATUS:-}"
journalctl -u "$1" -n 30 --no-pager -o cat | sed 's/^/amf-vmnode:   /'
