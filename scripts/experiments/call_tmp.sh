#!/bin/bash
cd build/carry/tfx && python3 check_tf.py 2>&1 | tail -60
