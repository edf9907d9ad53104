D=/tmp/r; mkdir -p $D
pack() { tar czf $OUT/all.tgz -C /tmp r; }
source .whl-cute/bootstrap.sh > $D/boot.txt 2>&1; pack
timeout 480 python3 -m pytest tests/gpu -q -rfE -p no:cacheprovider --durations=15 > $D/gpu_all.txt 2>&1; pack
