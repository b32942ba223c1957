# Sourced by the GPU machine's serving scripts (bench/gpu_serving.sh, gpu_serving_ab.sh): Triton's
# environment (bench/gpu_triton_env.sh), aiperf in $AIPERF_SITE, perf_analyzer in /tmp/perf_analyzer
# and the Llama-shaped model folder in /tmp/model_llama, from carried or staged device_carry folders.
source bench/gpu_carried.sh
AIPERF_WHEELS=$(carried aiperf)
PERF_ANALYZER_WHEEL=$(carried perf_analyzer)
if [ -d device_carry/pycuda_site ]; then  # a PyCUDA built on an earlier lease: no 100 s build
    mkdir -p /tmp/llgtriton-site && tar -xzf device_carry/pycuda_site/pycuda_site.tgz -C /tmp/llgtriton-site
fi
source bench/gpu_triton_env.sh
# aiperf gets the machine's own numpy 2 and libraries, not the stub's numpy 1.26 in $SITE.
AIPERF_SITE=/tmp/aiperf-site
"$PY" -m pip install -q --no-index --no-deps --upgrade --target "$AIPERF_SITE" "$AIPERF_WHEELS"/*.whl \
    device_carry/wheels/{pydantic,pydantic_core,annotated_types,typing_inspection,typing_extensions}-*.whl
PERF_ANALYZER=/tmp/perf_analyzer/perf_analyzer/bin/perf_analyzer
rm -rf /tmp/perf_analyzer && "$PY" -m zipfile -e "$PERF_ANALYZER_WHEEL"/perf_analyzer-*.whl /tmp/perf_analyzer
chmod +x "$PERF_ANALYZER"
rm -rf /tmp/model_llama && cp -r device_carry/model_llama /tmp/model_llama && xz -df /tmp/model_llama/tokenizer.json.xz
