// Placeholder until config.cpp lands (Foundation helper deletes this file).
