#!/bin/sh
# Reloads HAProxy's master. The Dataplane API runs this (without a shell of its own) when it
# cannot reload through the master CLI, which is the case for HAProxy < 2.7.
exec kill -USR2 "$(cat '@RUN_DIR@/haproxy.pid')"
