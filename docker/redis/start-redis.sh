#!/bin/sh
# The redis service's command: render the ACL file from the environment, then hand over to
# the official image's entrypoint (which drops root for the redis user).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
acl_dir=${INFERQ_REDIS_ACL_DIR:-/run/inferq}
if [ -z "${INFERQ_REDIS_ADMIN_PASSWORD:-}" ]; then
    # No admin password given: a random one nobody knows (the admin user is then unusable).
    INFERQ_REDIS_ADMIN_PASSWORD=$(od -An -N18 -tx1 /dev/urandom | tr -d ' \n')
fi
export INFERQ_REDIS_ADMIN_PASSWORD
mkdir -p "$acl_dir"
sh "$here/render-acl.sh" "$here/users.acl.template" "$acl_dir/users.acl"
if [ "$(id -u)" = 0 ] && id redis >/dev/null 2>&1; then
    chown -R redis:redis "$acl_dir"  # redis-server runs as this user and reads the file
fi
exec docker-entrypoint.sh redis-server "$here/redis.conf" \
    --aclfile "$acl_dir/users.acl" \
    --maxmemory "${INFERQ_REDIS_MAXMEMORY:-2gb}"
