; Inno Setup script of SAPO Swarm's Windows installer: wraps the folder PyInstaller built from
; installer/sapo-swarm.spec (dist\sapo-swarm). Built by .github/workflows/platforms.yml:
;   iscc /DVersion=0.1.0 /DSource=dist\sapo-swarm installer\windows\sapo-swarm.iss
; Never run here (no Windows machine). Installs for the current user without administrator
; rights, adds the Start menu entry and the sapo:// handler (invitation links open the app), and
; on uninstall leaves the user's runs in %LOCALAPPDATA%\sapo-swarm, which it never created.

#ifndef Version
  #define Version "0.0.0"
#endif
#ifndef Source
  #define Source "..\..\dist\sapo-swarm"
#endif

[Setup]
AppId={{6F1C3C52-4D0B-4E55-9E7A-5A90C0A5E2B1}
AppName=SAPO Swarm
AppVersion={#Version}
AppPublisher=SAPO Swarm developers
DefaultDirName={localappdata}\Programs\SAPO Swarm
DefaultGroupName=SAPO Swarm
PrivilegesRequired=lowest
ArchitecturesAllowed=x64compatible
ArchitecturesInstallIn64BitMode=x64compatible
OutputBaseFilename=sapo-swarm-{#Version}-windows-x86_64-setup
Compression=lzma2/fast
SolidCompression=no
UninstallDisplayIcon={app}\sapo-swarm.exe
CloseApplications=yes

[Files]
Source: "{#Source}\*"; DestDir: "{app}"; Flags: ignoreversion recursesubdirs createallsubdirs

[Icons]
Name: "{group}\SAPO Swarm"; Filename: "{app}\sapo-swarm.exe"
Name: "{group}\Uninstall SAPO Swarm"; Filename: "{uninstallexe}"

[Registry]
Root: HKCU; Subkey: "Software\Classes\sapo"; ValueType: string; ValueName: ""; ValueData: "URL:SAPO Swarm invitation"; Flags: uninsdeletekey
Root: HKCU; Subkey: "Software\Classes\sapo"; ValueType: string; ValueName: "URL Protocol"; ValueData: ""
Root: HKCU; Subkey: "Software\Classes\sapo\shell\open\command"; ValueType: string; ValueName: ""; ValueData: """{app}\sapo-swarm.exe"" ""%1"""

[Run]
Filename: "{app}\sapo-swarm.exe"; Description: "Start SAPO Swarm"; Flags: nowait postinstall skipifsilent
