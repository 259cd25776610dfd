#!/bin/bash
for arm in ${ARMS}; do
  case ${arm%%-*} in new) dir=/work/main;; old) dir=/tmp/wt-old;; esac
  ARM=$arm DIR=$dir STEPS=${STEPS:-7} ./run_rss.sh
done
