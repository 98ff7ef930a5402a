#!/bin/bash
# Mounts a Cloud Storage bucket with Cloud Storage FUSE, at the same path on every worker:
#
#   bash launch/mount_gcs.sh BUCKET MOUNT_POINT        (e.g. my-bucket /gcs/my-bucket)
#
# bert-jax reads records and writes checkpoints through ordinary file paths, and every host of a
# multi-host job must see the same workdir. Metadata caching is off so that each host sees the
# checkpoints the others just wrote (bert-jax also refuses to start when the hosts disagree on
# the latest checkpoint step); directory renames (Orbax's atomic commit) are allowed.
# Installs gcsfuse when it is missing (Debian/Ubuntu, as on TPU VM images). Safe to run again.
set -euo pipefail
bucket="${1:?usage: mount_gcs.sh BUCKET MOUNT_POINT}"
mount_point="${2:?usage: mount_gcs.sh BUCKET MOUNT_POINT}"

if ! command -v gcsfuse >/dev/null 2>&1; then
  repo="gcsfuse-$(lsb_release -c -s)"
  curl -fsSL https://packages.cloud.google.com/apt/doc/apt-key.gpg |
    sudo tee /usr/share/keyrings/cloud.google.asc >/dev/null
  echo "deb [signed-by=/usr/share/keyrings/cloud.google.asc] https://packages.cloud.google.com/apt $repo main" |
    sudo tee /etc/apt/sources.list.d/gcsfuse.list >/dev/null
  sudo apt-get update -qq
  sudo apt-get install -y -qq gcsfuse
fi
if mountpoint -q "$mount_point"; then
  echo "$mount_point is already mounted"
  exit 0
fi
sudo mkdir -p "$mount_point"
sudo chown "$(id -u):$(id -g)" "$mount_point"
gcsfuse --implicit-dirs --metadata-cache-ttl-secs=0 --rename-dir-limit=1000000 \
  "$bucket" "$mount_point"
echo "mounted gs://$bucket at $mount_point"
